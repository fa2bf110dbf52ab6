"""Memory accounting per GPU: weights, KV cache per token, KV capacity and the largest decode batch."""

from __future__ import annotations

from dataclasses import dataclass

from infersim.cards.hardware import HardwareCard
from infersim.cards.model import ModelCard
from infersim.config import Deployment, Workload
from infersim.modules.attention import attention_weight_params, kv_elements_per_token_per_layer
from infersim.modules.ffn import ffn_weight_params
from infersim.units import dtype_bytes

EMBEDDING_BYTES = 2.0  # embeddings, LM head and norms stay in bf16 in every serving engine we model


@dataclass(frozen=True)
class MemoryResult:
    weights_bytes: float  # per GPU
    kv_bytes_per_token: float  # one token's KV over all layers, whole model (unsharded)
    kv_bytes_per_token_per_gpu: float  # what one request's token occupies on one GPU
    hbm_bytes: float
    reserved_bytes: float
    kv_capacity_bytes: float  # HBM left for KV per GPU (negative: weights do not fit)
    request_context: int  # tokens one request holds at its end (ISL + OSL)
    max_batch_per_gpu: int  # requests per GPU whose full context fits

    @property
    def fits(self) -> bool:
        return self.kv_capacity_bytes > 0 and self.max_batch_per_gpu >= 1


def total_parameters(model: ModelCard) -> float:
    """All parameters of the model (unsharded), embeddings included."""
    from infersim.config import Deployment as _D

    one = _D(num_gpus=1)
    attn = attention_weight_params(model, 1)
    dense, moe = ffn_weight_params(model, one)
    norms = 2 * model.hidden_size
    layers = model.num_dense_layers * (attn + dense + norms) + model.num_moe_layers * (attn + moe + norms)
    embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    return layers + embed


def weights_per_gpu(model: ModelCard, dep: Deployment) -> float:
    wbytes = dtype_bytes(dep.precision.weight_dtype)
    attn = attention_weight_params(model, dep.attention.tp)
    dense, moe = ffn_weight_params(model, dep)
    per_stage_dense = model.num_dense_layers / dep.pp
    per_stage_moe = model.num_moe_layers / dep.pp
    linear = per_stage_dense * (attn + dense) + per_stage_moe * (attn + moe)
    norms = 2 * model.hidden_size * model.num_hidden_layers / dep.pp
    vocab_rows = model.vocab_size / dep.attention.tp * model.hidden_size
    # with PP the first stage holds the embedding and the last the LM head; report the larger
    embed = vocab_rows * (1 if model.tie_word_embeddings or dep.pp > 1 else 2)
    return linear * wbytes + (norms + embed) * EMBEDDING_BYTES


def kv_bytes_per_token(model: ModelCard, kv_dtype: str, attention_tp: int = 1) -> float:
    return model.num_hidden_layers * kv_elements_per_token_per_layer(model, attention_tp) * dtype_bytes(kv_dtype)


def memory_budget(model: ModelCard, hw: HardwareCard, dep: Deployment, workload: Workload) -> MemoryResult:
    weights = weights_per_gpu(model, dep)
    kv_model = kv_bytes_per_token(model, dep.precision.kv_cache)
    kv_gpu = kv_bytes_per_token(model, dep.precision.kv_cache, dep.attention.tp) / dep.pp
    reserved = hw.derates.runtime_reserved_bytes
    capacity = hw.peak.hbm_bytes - reserved - weights
    context = workload.isl + workload.osl
    # batch B per GPU: the attention TP group serves tp*B requests, each micro-batch of the
    # pipeline holds B per GPU and a GPU stores its share of every request's context
    per_request = context * kv_gpu * dep.attention.tp * dep.pp
    max_batch = int(capacity // per_request) if capacity > 0 else 0
    return MemoryResult(weights, kv_model, kv_gpu, hw.peak.hbm_bytes, reserved, capacity, context, max_batch)
