"""The int4jit command on a CPU machine: warm --compile-only, info, cache, concurrency."""
import os
import subprocess
import sys

import pytest

from int4jit import cache, cli, compiler, emulate, plan, tuner
from int4jit.shapes import GemvShape
from int4jit.spec import make_dequant_spec

from conftest import require_compiler


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "int4jit", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_warm_compile_only_fills_the_code_cache(capsys):
    require_compiler("cuda")
    require_compiler("hip")
    rc = cli.main(["warm", "--compile-only", "--arch", "sm_90", "--arch", "gfx90a",
                   "--shapes", "4096x4096,28672x4096", "--group", "32"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("sm_90") == 2 and out.count("gfx90a") == 2 and "heuristic" in out
    compiler._memo.clear()
    for N, K in [(4096, 4096), (28672, 4096)]:
        shape = GemvShape(N, K, 32, False)
        for arch in ("sm_90", "gfx90a"):
            assert compiler.is_cached(plan.plan(shape, arch).spec)  # must now be a disk hit


def test_warm_compile_only_honours_the_override(capsys, monkeypatch):
    require_compiler("cuda")
    monkeypatch.setenv("INT4JIT_CONFIG", "4096:4096=512,16")
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--shapes", "4096x4096,896x896,1000x1024"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    config, tier = rows["4096x4096"][3:5]   # the override's (BS, TN) at the default variant
    assert config.split(",")[:2] == ["512", "16"] and tier == "override"
    assert rows["896x896"][4] == "table"  # the shipped sm_90 row
    assert rows["1000x1024"][4] == "heuristic"


def test_warm_needs_shapes(capsys):
    assert cli.main(["warm", "--compile-only"]) == 2
    assert "no shapes" in capsys.readouterr().err


def test_warm_without_a_gpu_says_how_to_compile_instead(monkeypatch, capsys):
    def no_gpu():
        raise cli.BackendUnavailable("no GPU backend can run kernels here (test)")
    monkeypatch.setattr(cli.backends, "device", no_gpu)
    assert cli.main(["warm", "--shapes", "4096x4096"]) == 1
    err = capsys.readouterr().err
    assert "no GPU backend" in err and "int4jit warm --compile-only --arch sm_90" in err


@pytest.mark.parametrize("bad", ["4096", "4096x", "ax4", "4096*4096"])
def test_bad_shape_argument(bad):
    r = run_cli("warm", "--compile-only", "--shapes", bad)
    assert r.returncode == 2 and "expected NxK" in r.stderr


def test_shapes_file(tmp_path, capsys):
    require_compiler("cuda")
    f = tmp_path / "shapes.txt"
    f.write_text("# decode shapes\n896x896\n1152x896, 9728x896  # qwen\n")
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--shapes-file", str(f)]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s in ("896x896", "1152x896", "9728x896"))


def test_four_processes_warming_one_cache(tmp_path):
    require_compiler("cuda")
    env = {"INT4JIT_CACHE_DIR": str(tmp_path / "shared")}
    shape_sets = ["4096x4096,2048x2048", "4096x4096,896x896", "2048x2048,1152x896", "4096x4096,896x896"]
    procs = [subprocess.Popen([sys.executable, "-m", "int4jit", "warm", "--compile-only", "--arch", "sm_90",
                               "--shapes", s], env={**os.environ, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in shape_sets]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    files = list((tmp_path / "shared" / "code").rglob("*"))
    bins = [f for f in files if f.is_file()]
    assert len(bins) == len({f.name for f in bins})  # content-addressed: no duplicates
    assert not [f for f in bins if f.name.endswith(".tmp")]
    for f in bins:
        assert cache.read_code_object(f) is not None


def test_info_and_cache_commands(tmp_path):
    env = {"INT4JIT_CACHE_DIR": str(tmp_path / "c")}
    r = run_cli("info", env=env)
    assert r.returncode == 0 and "cuda: compiler" in r.stdout and str(tmp_path / "c") in r.stdout
    r = run_cli("cache", "path", env=env)
    assert r.stdout.strip() == str(tmp_path / "c")
    r = run_cli("cache", "export", env=env)
    assert r.returncode == 2 and "needs a FILE" in r.stderr


def test_main_command_without_gpu_compiles_default_targets(tmp_path):
    require_compiler("cuda")
    require_compiler("hip")
    r = run_cli("--shapes", "896x896", env={"INT4JIT_CACHE_DIR": str(tmp_path / "c")})
    if "no GPU here" not in r.stdout:
        pytest.skip("a GPU is present: the main command tunes instead")
    assert r.returncode == 0, r.stderr
    for arch in cli.DEFAULT_TARGETS:
        assert arch in r.stdout
    assert "worst relative error" in r.stdout and "compiled" in r.stdout
    assert "not checked: the vendor preludes" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.lstrip().startswith("896x896")]
    if emulate.compiler_path():  # each kernel's first and last blocks ran on the CPU, within tolerance
        assert len(rows) == len(cli.DEFAULT_TARGETS) and all(float(row[-1]) <= 2e-3 for row in rows)
    # again, with no C++ compiler to emulate with: nothing recompiled, and no claim that kernels ran
    again = run_cli("--shapes", "896x896", env={"INT4JIT_CACHE_DIR": str(tmp_path / "c"), "CXX": "no-such-compiler"})
    rows = [line for line in again.stdout.splitlines() if line.lstrip().startswith("896x896")]
    assert len(rows) == len(cli.DEFAULT_TARGETS) and all("cache hit" in r for r in rows)
    assert again.returncode == 0 and "not emulated: CXX='no-such-compiler' is no executable" in again.stdout
    assert "first and last blocks, run on the CPU" not in again.stdout


def test_warm_reports_a_target_the_compiler_cannot_build(capsys, monkeypatch):
    require_compiler("cuda")
    require_compiler("hip")
    from int4jit.backends import hip
    monkeypatch.setattr(hip, "hip_version", lambda: (5, 2, 21153))
    rc = cli.main(["warm", "--compile-only", "--arch", "gfx1151", "--arch", "sm_90", "--shapes", "1000x1024"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "FAILED" in captured.out and "heuristic" in captured.out  # sm_90 still warmed
    assert "predates gfx1151" in captured.err


def test_warm_compile_only_covers_bf16_models_and_their_prefill(capsys):
    """--dtype bfloat16 warms what a bf16 model's Int4Linear launches: the bf16 kernel (from its
    own table row where there is one, else the fp16 row of its shape), its early build, and the
    dequantising kernel of prefill in bf16."""
    require_compiler("cuda")
    table = tuner.shipped_table()["sm_90"]
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--dtype", "float16,bfloat16",
                     "--shapes", "4096x4096"]) == 0
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--dtype", "bfloat16", "--group", "32",
                     "--shapes", "896x896"]) == 0
    rows = {line.split()[0] + " " + line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.lstrip()[:1].isdigit()}
    assert set(rows) == {"4096x4096 g128", "4096x4096/bfloat16 g128", "896x896/bfloat16 g32"}
    bf = rows["4096x4096/bfloat16 g128"]
    assert bf[4] == "table" and float(bf[5]) == pytest.approx(table["4096x4096/g128/asym/bfloat16"]["us"], abs=0.01)
    assert float(rows["896x896/bfloat16 g32"][5]) == pytest.approx(table["896x896/g32/asym"]["us"], abs=0.01)
    compiler._memo.clear()
    for shape in (GemvShape(4096, 4096, 128, False, 1, "bfloat16"), GemvShape(896, 896, 32, False, 1, "bfloat16")):
        assert compiler.is_cached(plan.plan(shape, "sm_90").spec)
        assert compiler.is_cached(plan.plan(shape, "sm_90", fixed_weights=True).spec)
        assert compiler.is_cached(make_dequant_spec(shape, "sm_90", "bfloat16"))
    assert not compiler.is_cached(make_dequant_spec(GemvShape(896, 896, 32, False), "sm_90", "float16"))


@pytest.mark.parametrize("value", ["float32", "", "float16,int8"])
def test_warm_dtype_must_name_activation_types(value, capsys):
    with pytest.raises(SystemExit) as refused:  # argparse's refusal: a usage line and the reason
        cli.main(["warm", "--compile-only", "--dtype", value, "--shapes", "896x896"])
    assert refused.value.code == 2
    assert "--dtype: expected float16 or bfloat16" in capsys.readouterr().err


def test_warm_compile_only_covers_several_tokens(capsys):
    """--tokens 1,8 warms what calls of 8 tokens launch and tune (speculative decoding, small
    batches): the tc build and every candidate, so nothing compiles at run time; on an AMD target
    such calls have no kernel (Int4Linear dequantises + matmuls): said on its row, not a failure."""
    require_compiler("cuda")
    require_compiler("hip")
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--arch", "gfx90a", "--tokens", "1,8",
                     "--shapes", "2048x2048"]) == 0
    out = capsys.readouterr().out
    rows = {(line.split()[0], line.split()[2]): line.split() for line in out.splitlines() if line.lstrip()[:1].isdigit()}
    assert set(rows) == {(s, a) for s in ("2048x2048", "2048x2048/m8") for a in ("sm_90", "gfx90a")}
    assert rows[("2048x2048/m8", "gfx90a")][4:6] == ["no", "kernel"] and "Int4Linear runs dequantise + matmul" in out
    compiler._memo.clear()
    shape = GemvShape(2048, 2048, 128, False, 8)
    assert compiler.is_cached(plan.plan(shape, "sm_90").spec)
    assert all(compiler.is_cached(s) for s in plan.search_space(shape, "sm_90"))


def test_warm_tokens_take_lists_and_ranges():
    assert cli.parse_tokens("1,4,8") == [1, 4, 8]
    assert cli.parse_tokens("1-3,8,2") == [1, 2, 3, 8]
    assert cli.parse_tokens("1-16") == list(range(1, 17))


@pytest.mark.parametrize("value", ["0", "17", "4,x", "", "16-17", "3-1", "1,3-1", "-2", "1-2-3"])
def test_warm_tokens_must_be_1_to_16(value, capsys):
    with pytest.raises(SystemExit) as refused:
        cli.main(["warm", "--compile-only", "--tokens", value, "--shapes", "896x896"])
    assert refused.value.code == 2
    assert "--tokens: expected token counts 1..16" in capsys.readouterr().err
