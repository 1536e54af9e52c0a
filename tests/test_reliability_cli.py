"""Issue 20, classes 1, 7 and 9 (CPU): the process never aborts on an unknown target, the
CLI never shows a traceback and says what it did, the README's examples work here."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from int4jit import archive, cli
from int4jit.backends import cuda, hip
from int4jit.errors import CompileError

from conftest import require_compiler

README = Path(__file__).resolve().parent.parent / "README.md"


# -- class 1: the process never aborts --------------------------------------------------------
@pytest.mark.parametrize("arch", ["gfx90b", "gfx9a0", "gfx1003", "gfx999"])
def test_unknown_amd_target_is_refused_before_hiprtc(arch):
    require_compiler("hip")
    with pytest.raises(CompileError, match=f"{arch} is not an AMD target"):
        hip.check_target_known(arch)


@pytest.mark.parametrize("arch,need", [("gfx942", "5.7"), ("gfx1100", "5.4"), ("gfx1151", "6.2"), ("gfx1200", "6.3")])
def test_target_newer_than_hiprtc_names_the_rocm_it_needs(monkeypatch, arch, need):
    monkeypatch.setattr(hip, "hip_version", lambda: (5, 2, 21153))
    with pytest.raises(CompileError, match=f"install ROCm {need} or newer"):
        hip.check_target_known(arch)


def test_unknown_target_on_a_newer_hiprtc_is_probed_in_a_child(monkeypatch):
    """Past the table, a child process compiles a probe: its abort (hiprtc 5.2 here) is an error."""
    require_compiler("hip")
    monkeypatch.setattr(hip, "hip_version", lambda: (9, 0, 0))
    hip._probe.cache_clear()
    with pytest.raises(CompileError, match="gfx90b"):
        hip.check_target_known("gfx90b")
    monkeypatch.setattr(hip, "_FIRST_HIP", {k: v for k, v in hip._FIRST_HIP.items() if k != "gfx90a"})
    hip.check_target_known("gfx90a")  # the probe compiles: accepted
    hip._probe.cache_clear()


def test_warm_with_unknown_targets_does_not_abort():
    require_compiler("hip")
    r = subprocess.run([sys.executable, "-m", "int4jit", "warm", "--compile-only", "--arch", "gfx90b", "--arch",
                        "gfx9a0", "--arch", "gfx1003", "--arch", "gfx999", "--shapes", "896x896"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("is not an AMD target") == 4 and "Traceback" not in r.stderr


@pytest.mark.parametrize("arch", ["sm_50", "sm_70"])
def test_nvrtc_target_too_old_lists_the_supported_ones(arch):
    require_compiler("cuda")
    with pytest.raises(CompileError) as e:
        cuda.compile_source('extern "C" __global__ void k() {}', "k.cu", arch)
    msg = str(e.value)
    assert "it supports sm_" in msg and "sm_90" in msg and "invalid value" not in msg


# -- class 7: no tracebacks; options before the subcommand; human output ------------------------
def test_shapes_file_problems_are_one_line_naming_the_file(tmp_path, capsys):
    binary = tmp_path / "shapes.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\xff\xfe")
    bad = tmp_path / "bad.txt"
    bad.write_text("896x896\n4096by4096\n")
    for path, words in [("/nonexistent", "cannot read"), (str(binary), "not a text file"), (str(tmp_path), "cannot read"),
                        (str(bad), "line 2")]:
        assert cli.main(["warm", "--compile-only", "--shapes-file", path]) == 2
        err = capsys.readouterr().err
        assert path in err and words in err and len(err.splitlines()) == 1


def exit_code(argv):
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse's own refusal: a usage line and the reason
        return e.code


@pytest.mark.parametrize("shape", ["0x896", "896x0", "896x100", "²x4", "99999999999x4096", "896x896x2"])
def test_bad_shape_values(capsys, shape):
    assert exit_code(["warm", "--compile-only", "--shapes", shape]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("shape" in err or "N and K" in err)


def test_export_and_import_paths(tmp_path, capsys):
    assert cli.main(["cache", "export", "/nonexistent/dir/x.tgz"]) == 2
    assert "cannot write /nonexistent/dir/x.tgz" in capsys.readouterr().err
    assert cli.main(["cache", "import", str(tmp_path / "missing.tgz")]) == 2
    assert "missing.tgz" in capsys.readouterr().err
    (tmp_path / "junk.tgz").write_bytes(b"\x1f\x8b junk")
    assert cli.main(["cache", "import", str(tmp_path / "junk.tgz")]) == 2
    assert "the cache was not changed" in capsys.readouterr().err


def test_cache_import_prints_text_not_json(tmp_path, capsys):
    assert cli.main(["cache", "export", str(tmp_path / "x.tgz")]) == 0
    assert cli.main(["cache", "import", str(tmp_path / "x.tgz")]) == 0
    out = capsys.readouterr().out
    assert "imported" in out and "{" not in out


def _parsed(argv):
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    cli._apply_top_level_options(parser, args)
    return args


def test_options_before_warm_are_honoured():
    args = _parsed(["--arch", "sm_80", "--group", "32", "warm", "--compile-only", "--shapes", "896x896"])
    assert args.arch == ["sm_80"] and args.group == 32 and args.shapes == [(896, 896)]
    args = _parsed(["--arch", "sm_80", "warm", "--arch", "sm_90", "--shapes", "896x896"])
    assert args.arch == ["sm_80", "sm_90"]
    args = _parsed(["--arch", "sm_80", "--shapes", "896x896"])
    assert args.command is None and args.arch == ["sm_80"] and args.group == 128


@pytest.mark.parametrize("argv", [["--arch", "sm_80", "info"], ["--shapes", "896x896", "cache", "list"],
                                  ["--group", "32", "warm", "--group", "64"]])
def test_options_before_other_commands_are_refused(capsys, argv):
    with pytest.raises(SystemExit) as e:
        _parsed(argv)
    assert e.value.code == 2 and "given" in capsys.readouterr().err


def test_every_option_has_help():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    # inspect's options are int4jit.inspection's (add_arguments), checked with that module
    for name, p in [("int4jit", parser), *((n, q) for n, q in sub.choices.items() if n != "inspect")]:
        for a in p._actions:
            if a.dest not in ("help", "version", "command") and a is not sub:
                assert a.help, f"{name}: {a.option_strings or a.dest} has no help"


def test_cache_list_lists_entries(capsys):
    require_compiler("cuda")
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--shapes", "1152x640"]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "1152x640 g128 asym" in line]
    assert rows and all("sm_90" in r and re.search(r"\d+,\d+", r) and "kB" in r for r in rows)


def test_compile_specs_builds_in_worker_processes_and_reports_failures():
    require_compiler("cuda")
    require_compiler("hip")
    from int4jit import compiler
    from int4jit.shapes import GemvShape
    shape = GemvShape(2560, 1536, 128, False)  # no other test builds it: nothing in this process's memory
    specs = cli._warm_plan(shape, "sm_90", None)[1][:5]
    assert len(specs) == 5 and not any(compiler.is_cached(s) for s in specs)
    bad = cli._warm_plan(shape, "gfx1100", None)[1][:1]  # a target Debian's ROCm 5.2 does not know
    compiled, failed = cli.compile_specs(specs + bad, jobs=2)
    assert compiled == list(dict.fromkeys(specs + bad))  # each once, none of them cached before
    assert all(compiler.is_cached(s) for s in specs), failed  # on disk: the workers wrote them
    assert list(failed) == bad and "gfx1100" in failed[bad[0]]


def test_warm_jobs_must_be_a_positive_count(capsys):
    assert exit_code(["warm", "--compile-only", "--jobs", "0", "--shapes", "4096x4096"]) == 2
    assert "--jobs: expected a whole number of 1 or more" in capsys.readouterr().err


def test_warm_writes_into_a_cache_dir_set_after_the_kernels_were_built(tmp_path, monkeypatch, capsys):
    require_compiler("cuda")
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--shapes", "1024x512"]) == 0
    monkeypatch.setenv("INT4JIT_CACHE_DIR", str(tmp_path / "second"))
    assert cli.main(["warm", "--compile-only", "--arch", "sm_90", "--shapes", "1024x512"]) == 0
    assert list((tmp_path / "second").rglob("*.bin")), "the second cache dir got no code objects"


# -- class 9: the README's examples work on its own set-up ------------------------------------
def test_readme_compile_only_examples_name_targets_this_setup_knows():
    known = set(hip.known_targets((5, 2))) | {"sm_80", "sm_90"}
    lines = [line for line in README.read_text().splitlines() if "--compile-only" in line and "--arch" in line]
    assert lines
    for line in lines:
        for arch in re.findall(r"--arch[ =](\S+)", line):
            assert arch in known or "ROCm" in line, f"README shows {arch} as working here: {line}"


@pytest.mark.parametrize("words", [["4096x14336"], ["4096", "14336"], ["4096X14336"]])
def test_tune_takes_the_shape_as_warm_writes_it_or_as_n_k(words, monkeypatch, capsys):
    seen = []
    real = cli.GemvShape
    monkeypatch.setattr(cli, "GemvShape", lambda N, K, *rest: seen.append((N, K)) or real(N, K, *rest))

    def no_device(*a, **k):
        raise ValueError("no device in this test")
    monkeypatch.setattr(cli.backends, "device", no_device)
    assert exit_code(["tune", *words]) == 2
    assert seen == [(4096, 14336)]
    assert "no device in this test" in capsys.readouterr().err


@pytest.mark.parametrize("words,why", [(["4096x4096,8x8"], "tune takes one shape"), (["4096x4096;8x8"], "tune takes one shape"), (["1", "2", "3"], "tune takes one shape"),
                                       (["4096", "a"], "tune takes one shape"), (["4096xa"], "bad shape"), (["0x8"], "N and K must be 1 to")])
def test_tune_refuses_anything_but_one_shape(words, why, capsys, monkeypatch):
    def no_device(*a, **k):
        raise AssertionError("tune asked for a device before checking its shape")
    monkeypatch.setattr(cli.backends, "device", no_device)
    assert exit_code(["tune", *words]) == 2
    assert why in capsys.readouterr().err


def test_tune_refuses_a_bad_shape_or_dtype_before_asking_for_a_device(capsys, monkeypatch):
    def no_device(*a, **k):
        raise AssertionError("tune asked for a device before checking its arguments")
    monkeypatch.setattr(cli.backends, "device", no_device)
    assert exit_code(["tune", "4096", "4000"]) == 2
    assert "K=4000 must be a multiple of the group size 128" in capsys.readouterr().err
    assert exit_code(["tune", "4096", "4096", "--dtype", "float32"]) == 2
    assert "invalid choice: 'float32'" in capsys.readouterr().err
