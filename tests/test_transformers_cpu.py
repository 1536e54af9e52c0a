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

from conftest import assert_fused_like_llama  # noqa: E402


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
