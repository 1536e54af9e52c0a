"""transformers models (small configs, random weights) quantised with quantize_model on the CPU:
the layers each model calls on one input (q/k/v, gate/up) are fused, and the fused model generates
what the same model with every layer alone does (Llama; Qwen2, whose q/k/v have biases)."""
import copy
import os

import pytest

if os.environ.get("CI"):
    import torch  # CI installs both (scripts/test.sh, the test extra): a skip would hide that nothing ran
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

from int4jit.torch import Int4Linear, _Fused, quantize_model  # noqa: E402

from conftest import assert_fused_like_llama, gptq_v1_tensors  # noqa: E402


@pytest.mark.parametrize("family", ["Llama", "Qwen2"])
def test_fused_model_generates_what_the_unfused_one_does(family):
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{family}Config")(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                                    max_position_embeddings=128)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    alone = quantize_model(copy.deepcopy(model), group_size=64, fuse=False)
    fused = quantize_model(model, group_size=64)
    ids = torch.randint(0, 1000, (1, 9))
    with torch.no_grad():
        got = fused.generate(ids, max_new_tokens=6, do_sample=False)
        want = alone.generate(ids, max_new_tokens=6, do_sample=False)
        torch.testing.assert_close(fused(got).logits, alone(got).logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, want)
    assert_fused_like_llama(fused)
    assert (fused.model.layers[0].self_attn.q_proj.bias is not None) == (family == "Qwen2")
    assert not any(isinstance(m._shared, _Fused) for m in alone.modules() if isinstance(m, Int4Linear))


def _tiny_qwen2(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def test_load_quantized_reads_a_gptq_checkpoint_into_the_model_it_was_made_from(caplog):
    from int4jit.torch import load_quantized
    quantized = quantize_model(_tiny_qwen2(0), group_size=64, fuse=False)  # what the checkpoint holds
    int4 = {n for n, m in quantized.named_modules() if isinstance(m, Int4Linear)}
    checkpoint = {k: v for k, v in quantized.state_dict().items() if k.rpartition(".")[0] not in int4}
    for name in int4:
        checkpoint.update({f"{name}.{k}": v for k, v in gptq_v1_tensors(quantized.get_submodule(name)).items()})
    config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False,
                                      "sym": False, "checkpoint_format": "gptq"}}
    loaded = load_quantized(_tiny_qwen2(1), checkpoint, config)  # other random weights: all must be replaced
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    names = [n for n, m in loaded.named_modules() if isinstance(m, Int4Linear)]
    assert names == [n for n, m in quantized.named_modules() if isinstance(m, Int4Linear)] and len(names) == 15
    for name in names:
        a, b = loaded.get_submodule(name), quantized.get_submodule(name)
        assert all(torch.equal(x, y) for x, y in zip((a.w, a.scales, a.zeros), (b.w, b.scales, b.zeros)))
    ids = torch.randint(0, 1000, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, quantized(ids).logits)
        assert torch.equal(loaded.generate(ids, max_new_tokens=4, do_sample=False),
                           quantized.generate(ids, max_new_tokens=4, do_sample=False))

    # what does not fit is named
    bad = dict(checkpoint, **{"model.norm.qweight": checkpoint["model.layers.0.mlp.up_proj.qweight"]})
    with pytest.raises(ValueError, match="'model.norm' .*Qwen2RMSNorm; expected an nn.Linear"):
        load_quantized(_tiny_qwen2(1), bad, config)
    swapped = dict(checkpoint)
    for k in ("qweight", "qzeros", "scales"):
        swapped[f"model.layers.0.mlp.up_proj.{k}"] = checkpoint[f"model.layers.0.mlp.down_proj.{k}"]
    with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj' holds 256x512 weights; .* 512x256"):
        load_quantized(_tiny_qwen2(1), swapped, config)
    fresh = _tiny_qwen2(1)
    with pytest.raises(ValueError, match="1 tensors the model does not: extra.weight"):
        load_quantized(fresh, dict(checkpoint, **{"extra.weight": torch.zeros(3)}), config)
    assert not any(isinstance(m, Int4Linear) for m in fresh.modules())  # refused before anything was swapped
    with pytest.raises(ValueError, match="checkpoint layer 'lm_head': .*group_size=48"):
        load_quantized(_tiny_qwen2(1), checkpoint, {"quant_method": "gptq", "bits": 4, "group_size": 48})
    caplog.clear()
    load_quantized(_tiny_qwen2(1), {k: v for k, v in checkpoint.items() if k != "model.norm.weight"}, config)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "lacks 1 of the model's tensors" in warned[0] and "model.norm.weight" in warned[0]


def test_load_quantized_takes_a_tied_lm_head_from_the_embeddings(caplog):
    # GPTQ leaves lm_head alone; a tied one is not in the checkpoint at all, and is not missing
    from int4jit.torch import load_quantized

    def tied(seed):
        torch.manual_seed(seed)
        cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                       tie_word_embeddings=True)
        return transformers.Qwen2ForCausalLM(cfg).eval()
    quantized = quantize_model(tied(0), group_size=64, skip=["lm_head"], fuse=False)
    int4 = {n for n, m in quantized.named_modules() if isinstance(m, Int4Linear)}
    checkpoint = {k: v for k, v in quantized.state_dict().items()
                  if k != "lm_head.weight" and k.rpartition(".")[0] not in int4}
    for name in int4:
        checkpoint.update({f"{name}.{k}": v for k, v in gptq_v1_tensors(quantized.get_submodule(name)).items()})
    loaded = load_quantized(tied(1), checkpoint, {"quant_method": "gptq", "bits": 4, "group_size": 64})
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 1000, (1, 5))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, quantized(ids).logits)


def test_load_quantized_reads_back_what_quantize_model_saved(tmp_path):
    # quantize once, save, and load into a model built from the config: no quantizing of random weights
    from int4jit.torch import load_quantized
    safetensors = pytest.importorskip("safetensors.torch")
    quantized = quantize_model(_tiny_qwen2(0), group_size=64)  # fused: the layers' weights are views
    ids = torch.randint(0, 1000, (1, 9))
    with torch.no_grad():
        want = quantized(ids).logits  # the first call fuses q/k/v and gate/up
    path = tmp_path / "model.safetensors"
    safetensors.save_file({k: v.contiguous() for k, v in quantized.state_dict().items()}, str(path))
    loaded = load_quantized(_tiny_qwen2(1), safetensors.load_file(str(path)))
    assert sum(isinstance(m, Int4Linear) for m in loaded.modules()) == 15
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, want)
    with pytest.raises(TypeError, match="GPTQ/AWQ layers .*pass its quantize config"):
        load_quantized(_tiny_qwen2(1), {"lm_head.qweight": torch.zeros(32, 1000, dtype=torch.int32)})
