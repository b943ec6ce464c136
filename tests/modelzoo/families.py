"""The Model Zoo catalogue, family by family: each model built tiny from its own config
class, starting from one of the family's own params YAMLs (its architecture switches:
positions, norms, nonlinearities, attention variants, mixture of experts, ...) with only
the sizes shrunk and dropout off, the batch its data processor yields, and its own loss.

A family without a YAML in Model Zoo starts from a config written here: GPT-2 and GPT-NeoX
as Model Zoo documents them, generic_image_encoders as a recipe of DINO's components.
"""
import contextlib
import copy
import dataclasses
import inspect
import os
import warnings
from collections.abc import Callable

import torch
import yaml

import cerebras.pytorch as cstorch

from tests.modelzoo.common import BATCH, HEADS, HIDDEN, LAYERS, MODELZOO_SRC, SEQ, VOCAB, \
    import_modelzoo, token_batches

MODELS = os.path.join(MODELZOO_SRC, "cerebras", "modelzoo", "models")
FILTER = 2 * HIDDEN
HEAD_DIM = HIDDEN // HEADS
IMAGE, PATCH, CHANNELS, CLASSES = 16, 4, 3, 10

# Size keys and the tiny value each gets, wherever it appears in a model's params.
SIZES = {
    "hidden_size": HIDDEN, "d_model": HIDDEN, "filter_size": FILTER, "d_ff": FILTER,
    "num_hidden_layers": LAYERS, "encoder_num_hidden_layers": LAYERS,
    "decoder_num_hidden_layers": LAYERS, "num_heads": HEADS, "d_kv": HEAD_DIM,
    "vocab_size": VOCAB, "src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB,
    "max_position_embeddings": SEQ, "src_max_position_embeddings": SEQ,
    "tgt_max_position_embeddings": SEQ, "rotary_dim": HEAD_DIM, "attention_inner_dim": HIDDEN,
    "attention_sliding_window_length": SEQ // 2, "image_size": [IMAGE, IMAGE],
    "patch_size": [PATCH, PATCH], "num_classes": CLASSES, "frequency_embedding_size": 16,
    "num_experts": 4, "num_kv_groups": 1,
}
DROPOUTS = ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate", "embd_pdrop",
            "residual_dropout_rate", "relu_dropout_rate", "label_dropout_rate", "dropout")


def shrink(params):
    """The params with every size key set tiny and every dropout rate zero, recursively
    (sub-models: DPO's policy, DPR's encoders, LLaVA's image and text models)."""
    if isinstance(params, list):
        return [shrink(p) for p in params]
    if not isinstance(params, dict):
        return params
    out = {}
    for key, value in params.items():
        if key in SIZES:
            out[key] = SIZES[key]
        elif key in DROPOUTS:
            out[key] = 0.0
        else:
            out[key] = shrink(value)
    return out


def yaml_model_params(path):
    with open(os.path.join(MODELS, path)) as f:
        params = yaml.safe_load(f)
    return params["trainer"]["init"]["model"] if "trainer" in params else params["model"]


def merge(base, overrides):
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclasses.dataclass
class Family:
    name: str
    model: str                     # "module.Class" under cerebras.modelzoo.models
    params: dict                   # the model's params before shrinking
    batches: Callable[[int, int], list]   # (steps, seed) -> batches
    overrides: dict = dataclasses.field(default_factory=dict)  # after shrinking
    yaml: str | None = None
    keep: str = ""                 # the architecture switches, for the table
    autocast: bool = False         # its forward needs mixed precision (bfloat16)
    adjust: Callable = None        # params -> params, for sizes that must agree elsewhere
    sgd_lr: float = 0.1            # larger where the loss is scaled down (loss_weight)
    # parameters whose gradient is zero but for float32 rounding (state-dict key suffixes)
    noise_gradients: tuple = ()

    def model_class(self):
        module, cls = self.model.rsplit(".", 1)
        return getattr(import_modelzoo("cerebras.modelzoo.models." + module), cls)

    def config(self):
        cls = self.model_class()
        config_cls = inspect.signature(cls.__init__).parameters["config"].annotation
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params = merge(shrink(self.params), self.overrides)
            return config_cls(**(self.adjust(params) if self.adjust else params))

    def build(self, seed=0):
        """The model, then every parameter moved off its initial value at random (norm
        scales and biases start at ones and zeros)."""
        cls = self.model_class()
        config = self.config()
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls(config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        return model

    @contextlib.contextmanager
    def precision(self):
        """Around the whole run: bfloat16 as the half dtype where the family computes in
        mixed precision (what Model Zoo's precision callback sets on CPU)."""
        if not self.autocast:
            yield
            return
        before = cstorch.amp.get_half_dtype_str(), cstorch.amp.mixed_precision()
        cstorch.amp.set_half_dtype("bfloat16")
        try:
            yield
        finally:
            cstorch.amp.set_half_dtype(before[0])
            cstorch.amp.enable_mixed_precision(before[1])   # set_half_dtype switched it on

    def compute_loss(self, model, batch):
        # Model Zoo's forwards pop keys off the batch dict: each call gets its own copy
        batch = dict(batch) if isinstance(batch, dict) else batch
        amp = cstorch.amp.autocast() if self.autocast else contextlib.nullcontext()
        with amp, summaries():
            return model(batch)


class _DiscardSummaries:
    """Where `summarize_scalar` sends what a model logs (Mixtral's load-balancing loss,
    DPO's rewards) outside Model Zoo's Trainer: nowhere; the loss is what is compared."""

    def log_metrics(self, **metrics):
        pass


@contextlib.contextmanager
def summaries():
    callbacks = import_modelzoo("cerebras.modelzoo.trainer.callbacks.summaries")
    stack = callbacks._GLOBAL_SUMMARIES._trainer_stack
    stack.append(_DiscardSummaries())
    try:
        yield
    finally:
        stack.pop()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def lm_batches(steps, seed):
    return token_batches(steps, seed=seed)


def dpo_batches(steps, seed):
    chosen, rejected = token_batches(steps, seed), token_batches(steps, seed + 100)
    return [{**{"chosen_" + k: v for k, v in c.items()},
             **{"rejected_" + k: v for k, v in r.items()}} for c, r in zip(chosen, rejected)]


def mlm_batches(steps, seed, masked=4, nsp=True, vocab=VOCAB):
    """BERT's pretraining batch as BertHDF5DataProcessor yields it: tokens, padding mask,
    segment ids, the masked positions with their labels and weights, NSP labels."""
    g = _gen(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
        attention = (torch.arange(SEQ) < lengths[:, None]).to(torch.int32)
        positions = torch.stack([torch.randperm(SEQ // 2, generator=g)[:masked]
                                 for _ in range(BATCH)]).to(torch.int32)
        batch = {"input_ids": torch.randint(0, vocab, (BATCH, SEQ), generator=g,
                                            dtype=torch.int32) * attention,
                 "attention_mask": attention,
                 "masked_lm_positions": positions,
                 "masked_lm_mask": torch.ones(BATCH, masked, dtype=torch.int32),
                 "labels": torch.randint(0, vocab, (BATCH, masked), generator=g,
                                         dtype=torch.int32)}
        if nsp:
            batch["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).to(torch.int32) \
                .expand(BATCH, SEQ).contiguous() * attention
            batch["next_sentence_label"] = torch.randint(0, 2, (BATCH,), generator=g,
                                                         dtype=torch.int32)
        out.append(batch)
    return out


def esm2_batches(steps, seed):
    return mlm_batches(steps, seed, nsp=False, vocab=33)


def seq2seq_batches(steps, seed):
    """T5's batch as T5HDF5DataProcessor yields it: encoder tokens and mask, decoder inputs
    (labels shifted right), decoder mask (the loss mask), labels."""
    g = _gen(seed)
    out = []
    for _ in range(steps):
        src_len = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
        tgt_len = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
        src_mask = (torch.arange(SEQ) < src_len[:, None]).to(torch.int32)
        tgt_mask = (torch.arange(SEQ) < tgt_len[:, None]).to(torch.int32)
        labels = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g, dtype=torch.int32)
        decoder_inputs = torch.cat([torch.zeros(BATCH, 1, dtype=torch.int32), labels[:, :-1]],
                                   dim=1)
        out.append({"input_ids": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g,
                                               dtype=torch.int32) * src_mask,
                    "attention_mask": src_mask,
                    "decoder_input_ids": decoder_inputs * tgt_mask,
                    "decoder_attention_mask": tgt_mask,
                    "labels": labels * tgt_mask})
    return out


def dpr_batches(steps, seed, contexts=2):
    """DPRHDF5DataProcessor's batch: questions (B, S) and per question one positive and one
    hard-negative context (B, 2, S); the label of question i is context 2i."""
    g = _gen(seed)
    out = []
    for _ in range(steps):
        q = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g, dtype=torch.int32)
        c = torch.randint(1, VOCAB, (BATCH, contexts, SEQ), generator=g, dtype=torch.int32)
        out.append({"questions_input_ids": q,
                    "questions_attention_mask": torch.ones_like(q),
                    "questions_token_type_ids": torch.zeros_like(q),
                    "ctx_input_ids": c,
                    "ctx_attention_mask": torch.ones_like(c),
                    "ctx_token_type_ids": torch.zeros_like(c),
                    "labels": torch.arange(BATCH) * contexts})
    return out


def image_batches(steps, seed, channels=CHANNELS, size=IMAGE, classes=CLASSES):
    g = _gen(seed)
    return [(torch.randn(BATCH, channels, size, size, generator=g),
             torch.randint(0, classes, (BATCH,), generator=g))
            for _ in range(steps)]


def mnist_batches(steps, seed):
    g = _gen(seed)
    return [(torch.rand(BATCH, 784, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(steps)]


def dit_batches(steps, seed, latent=4, size=8, diffusion_steps=1000):
    """DiffusionLatentImageNet1KProcessor's batch: a VAE latent, its class label, the noise
    to add and the diffusion timestep."""
    g = _gen(seed)
    return [{"input": torch.randn(BATCH, latent, size, size, generator=g),
             "label": torch.randint(0, CLASSES, (BATCH,), generator=g, dtype=torch.int32),
             "diffusion_noise": torch.randn(BATCH, latent, size, size, generator=g),
             "timestep": torch.randint(0, diffusion_steps, (BATCH,), generator=g,
                                       dtype=torch.int32)}
            for _ in range(steps)]


def _text_image_tokens(g, patches):
    """Labels, loss mask and key padding mask of a LLaVA-style sequence whose first
    `patches` positions after the first token hold the image."""
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g, dtype=torch.int32)
    loss_mask = torch.ones(BATCH, SEQ, dtype=torch.int32)
    loss_mask[:, :1 + patches] = 0
    return {"text_input_ids": tokens[:, :-1].contiguous(),
            "labels": tokens[:, 1:].contiguous(),
            "loss_mask": loss_mask,
            "key_padding_mask": torch.zeros(BATCH, SEQ, dtype=torch.int32)}


PATCHES = (IMAGE // PATCH) ** 2
MM_IMAGE = 8
MM_PATCHES = (MM_IMAGE // PATCH) ** 2


def llava_batches(steps, seed):
    """LlavaHDF5MapDataProcessor's batch: the image, and text whose image positions (from
    `image_start_idx`) the image's patch features replace."""
    g = _gen(seed)
    return [{"image_data": torch.randn(BATCH, CHANNELS, MM_IMAGE, MM_IMAGE, generator=g),
             **_text_image_tokens(g, MM_PATCHES)} for _ in range(steps)]


def mms_batches(steps, seed):
    """MultimodalSimpleHDF5MapDataProcessor's batch: one image per sample, where its patch
    features go in the sequence and which tokens are image tokens."""
    g = _gen(seed)
    out = []
    for _ in range(steps):
        batch = _text_image_tokens(g, MM_PATCHES)
        loc = torch.arange(1, 1 + MM_PATCHES, dtype=torch.int32).expand(BATCH, 1, MM_PATCHES)
        modality = torch.zeros(BATCH, SEQ, dtype=torch.int32)
        modality[:, 1:1 + MM_PATCHES] = 1
        out.append({"image_data": torch.randn(BATCH, 1, CHANNELS, MM_IMAGE, MM_IMAGE,
                                              generator=g),
                    "image_data_loc": loc.contiguous(), "token_modality_idx": modality,
                    **batch})
    return out


GPT2 = {  # GPT-2 as Model Zoo documents it (it ships no YAML): learned positions, tied
    "name": "gpt2", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
    "num_heads": HEADS, "filter_size": FILTER, "max_position_embeddings": SEQ,
    "position_embedding_type": "learned", "share_embedding_weights": True,
    "nonlinearity": "gelu", "embd_pdrop": 0.0, "dropout_rate": 0.0,
    "attention_dropout_rate": 0.0}

GPT_NEOX = {  # GPT-NeoX as Model Zoo documents it: rotary on part of each head, untied norms
    "name": "gpt-neox", "position_embedding_type": "rotary", "rotary_dim": HEAD_DIM // 2,
    "use_untied_layer_norm": True, "share_embedding_weights": False,
    "use_bias_in_output": False, "nonlinearity": "gelu", "layer_norm_epsilon": 1e-5,
    "use_projection_bias_in_attention": True, "use_ffn_bias_in_attention": True,
    "use_ffn_bias": True, "vocab_size": VOCAB, "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS, "num_heads": HEADS, "filter_size": FILTER,
    "max_position_embeddings": SEQ, "embedding_dropout_rate": 0.0,
    "attention_dropout_rate": 0.0, "residual_dropout_rate": 0.0}


DINO_YAML = "vision/dino/configs/params_dinov2_large_patch14_img224.yaml"
SSL_OUT, GLOBAL_CROPS, LOCAL_CROPS, LOCAL_IMAGE = 64, 2, 2, 8


def ssl_sizes(params):
    """DINO's heads and losses agree on their sizes: head input = trunk width, loss input =
    head output; the teacher-temperature warm-up shrunk so that a few steps cross it, and
    stochastic depth (random) off."""
    for trunk in params["image_model_trunks"]:
        model = trunk["image_model"]
        model["stochastic_depth_drop_prob"] = 0.0
        if "interpolate_position_embedding" in model:
            model["interpolate_position_embedding"]["local_patch_dims"] = \
                [LOCAL_IMAGE // PATCH] * 2
    for head in params["heads"]:
        head["head_model"].update(input_size=HIDDEN, bottleneck_size=16, output_size=SSL_OUT)
    for loss in params["losses"]:
        if "input_size" in loss["loss"]:
            loss["loss"].update(input_size=SSL_OUT, warmup_teacher_temp_steps=2,
                                total_steps=10)
    return params


def ssl_batches(steps, seed):
    """Dinov2Transform's batch: global crops (B, 2, C, H, W), local crops, and which patches
    of each global crop iBOT masks."""
    g = _gen(seed)
    return [{"global_view": torch.randn(BATCH, GLOBAL_CROPS, CHANNELS, IMAGE, IMAGE, generator=g),
             "local_view": torch.randn(BATCH, LOCAL_CROPS, CHANNELS, LOCAL_IMAGE, LOCAL_IMAGE,
                                       generator=g),
             "collated_masks": torch.rand(BATCH, GLOBAL_CROPS, PATCHES, generator=g) < 0.3}
            for _ in range(steps)]


def projector_sizes(params):
    """LLaVA's projectors map the image model's width to the text model's; the image,
    MM_PATCHES patches, starts right after the first token."""
    for projector in (params.get("projector") or {}).values():
        projector.update(input_unit=HIDDEN, layers_units=[HIDDEN, HIDDEN])
    if "image_model" in params:
        params["image_model"]["image_size"] = [MM_IMAGE] * 2
    if "image_model_list" in params:
        params["image_model_list"]["global_image_projection"].update(
            input_unit=HIDDEN, layers_units=[HIDDEN, HIDDEN])
        for model in params["image_model_list"]["image_models"]:
            model["image_encoder"]["image_size"] = [MM_IMAGE] * 2
    if "image_start_idx" in params:
        params["image_start_idx"] = 1
    return params


def ssl_dino_v1_koleo():
    """`generic_image_encoders` (BaseSSLArch, the framework DINO is one recipe of) with a
    recipe of its own, from DINO's components: a student and an EMA teacher ViT without
    masked patches (the teacher its exponential moving average, updated in the forward
    pass), DINO heads on the CLS tokens, the DINO distillation loss over global
    and local crops plus the KoLeo regulariser on the student's global CLS tokens."""
    dino = yaml_model_params(DINO_YAML)
    trunks = copy.deepcopy(dino["image_model_trunks"])
    for trunk in trunks:
        trunk["image_model"]["use_masked_patches"] = False
    trunks[1]["forward_args"] = [["ssl_transform.output('global_view')", None, None],
                                 ["ssl_transform.output('local_view')", None, None]]
    return {"name": "generic_image_encoders", "image_model_trunks": trunks,
            "heads": copy.deepcopy(dino["heads"][:2]),
            "losses": [copy.deepcopy(dino["losses"][0]),
                       {"forward_args": [["image_model_trunks.output(1,0,1)"]],
                        "loss": {"name": "KoLeoLoss"}, "loss_weight": 0.1}],
            "copy_init_weights": copy.deepcopy(dino["copy_init_weights"][:2]),
            "ema": copy.deepcopy(dino["ema"][:2]),
            "freeze": ["image_model_trunks.model.0.*", "heads.model.0.*"]}


def _yaml(family, path, **fields):
    return Family(family, params=yaml_model_params(path), yaml=path, **fields)


LM = dict(batches=lm_batches)
FAMILIES = {f.name: f for f in [
    Family("gpt2", "nlp.gpt2.model.Gpt2Model", GPT2,
           keep="learned positions, LayerNorm, GELU, tied, num_tokens loss scaling", **LM),
    _yaml("gpt3", "nlp/gpt3/configs/Cerebras_GPT/111m.yaml",
          model="nlp.gpt3.model.GPT3Model", sgd_lr=50.0, keep="learned positions, LayerNorm, GELU, "
          "tied, batch_size loss scaling", **LM),
    _yaml("gptj", "nlp/gptj/configs/params_gptj_6B.yaml", model="nlp.gptj.model.GptjModel",
          keep="rotary, parallel attention+FFN, untied head with bias", **LM),
    Family("gpt-neox", "nlp.gptj.model.GPTNeoXModel", GPT_NEOX,
           keep="partial rotary, untied layer norms", **LM),
    _yaml("llama", "nlp/llama/configs/params_llama2_7b.yaml",
          model="nlp.llama.model.LlamaModel", keep="rotary, RMSNorm, SwiGLU, untied", **LM),
    _yaml("mistral", "nlp/mistral/configs/params_mistral_7B_msl128k.yaml",
          model="nlp.mistral.model.MistralModel",
          keep="rotary, RMSNorm, SwiGLU, grouped-query, sliding window", **LM),
    _yaml("mixtral", "nlp/mixtral/configs/params_mixtral_8x7b.yaml",
          model="nlp.mixtral.model.MixtralModel",
          keep="mixture of experts (top-2, fp32 router, load-balancing loss), rotary, "
               "RMSNorm, SwiGLU", **LM),
    _yaml("falcon", "nlp/falcon/configs/params_falcon_7b.yaml",
          model="nlp.falcon.model.FalconModel",
          keep="multi-query attention, rotary, parallel attention+FFN", **LM),
    _yaml("bloom", "nlp/bloom/configs/params_bloom_7b.yaml", model="nlp.bloom.model.BloomModel",
          keep="ALiBi, embedding LayerNorm, tied", **LM),
    _yaml("btlm", "nlp/btlm/configs/params_btlm_2p7b_2k.yaml", model="nlp.btlm.model.BTLMModel",
          keep="ALiBi, SwiGLU, muP scales (embeddings, logits, qk/d)", **LM),
    _yaml("jais", "nlp/jais/configs/params_jais_13b.yaml", model="nlp.jais.model.JAISModel",
          keep="ALiBi, SwiGLU, muP scales, fp32 softmax", **LM),
    _yaml("santacoder", "nlp/santacoder/configs/params_santacoder_1b.yaml",
          model="nlp.santacoder.model.SantaCoderModel",
          keep="multi-query attention, learned positions, fp32 softmax", **LM),
    _yaml("starcoder", "nlp/starcoder/configs/params_starcoder_15b.yaml",
          model="nlp.starcoder.model.StarCoderModel",
          keep="multi-query attention, learned positions, fp32 softmax", **LM),
    _yaml("gemma2", "nlp/gemma2/configs/params_gemma2_9b_msl8k.yaml",
          model="nlp.gemma2.model.Gemma2Model",
          keep="sandwich RMSNorm, GeGLU, logit soft-capping, alternate sliding window, "
               "grouped-query", **LM),
    _yaml("dpo", "nlp/dpo/configs/params_zephyr_7b_dpo.yaml", model="nlp.dpo.model.DPOModel",
          batches=dpo_batches, keep="Mistral policy and frozen reference, sigmoid DPO loss"),
    _yaml("bert", "nlp/bert/configs/bert_base_MSL128.yaml",
          model="nlp.bert.model.BertForPreTrainingModel", batches=mlm_batches,
          keep="MLM (gathered positions) + NSP"),
    _yaml("esm2", "nlp/esm2/configs/params_esm2_t12_35M_UR50D.yaml",
          model="nlp.esm2.model.Esm2ForPreTrainingModel", batches=esm2_batches,
          overrides={"vocab_size": 33},
          keep="rotary, token dropout, final LayerNorm, MLM only"),
    _yaml("dpr", "nlp/dpr/configs/params_dpr_base_nq.yaml",
          model="nlp.dpr.model.DPRWrapperModel", batches=dpr_batches,
          # the last LayerNorm's bias shifts every embedding alike; the question-context
          # scores' softmax ignores what it adds to all contexts of a question
          noise_gradients=("encoder.transformer_encoder.layers.1.norm2.bias",),
          keep="bi-encoder BERTs, hard negatives, contrastive loss"),
    _yaml("t5", "nlp/t5/configs/t5_3B.yaml", model="nlp.t5.model.T5ForConditionalGenerationModel",
          batches=seq2seq_batches, overrides={"extra_ids": 0},
          keep="relative position buckets, ReLU, LayerNorm, shared embeddings"),
    _yaml("transformer", "nlp/transformer/configs/transformer_base.yaml",
          model="nlp.transformer.model.TransformerModel", batches=seq2seq_batches,
          keep="fixed sinusoidal positions, ReLU, shared embeddings, batch-size loss scaling"),
    _yaml("vision_transformer",
          "vision/vision_transformer/configs/params_vit_base_patch_16_imagenet_1k.yaml",
          model="vision.vision_transformer.model.ViTClassificationWrapperModel",
          batches=image_batches, keep="conv patch embedding, CLS token, pre-LN"),
    _yaml("dit", "vision/dit/configs/params_dit_small_patchsize_2x2.yaml",
          model="vision.dit.model.DiTModel", batches=dit_batches,
          overrides={"patch_size": [2, 2], "latent_size": [8, 8], "vae": {
              "latent_size": [8, 8], "block_out_channels": [8], "norm_num_groups": 4,
              "down_block_types": ["DownEncoderBlock2D"], "up_block_types": ["UpDecoderBlock2D"]}},
          autocast=True,
          keep="adaLN-zero blocks, timestep and label embeddings, diffusion noising, "
               "bfloat16 autocast"),
    _yaml("dino", DINO_YAML,
          model="vision.dino.model.DinoModel", batches=ssl_batches, adjust=ssl_sizes,
          keep="DINOv2: student and frozen teacher ViTs (masked patches, layer scale, "
               "interpolated positions for local crops), weight-normed DINO heads, "
               "DINO + iBOT losses with centering and teacher temperature schedule"),
    Family("generic_image_encoders", "vision.generic_image_encoders.base.BaseSSLArch.BaseSSLArch",
           ssl_dino_v1_koleo(), batches=ssl_batches, adjust=ssl_sizes,
           keep="BaseSSLArch: student and frozen teacher ViTs, DINO heads, DINO "
                "distillation over global and local crops + KoLeo"),
    _yaml("llava", "multimodal/llava/configs/params_llava_v1p5_pretrain_7b_phase2_MSL2K.yaml",
          model="multimodal.llava.model.LlavaModel", batches=llava_batches,
          adjust=projector_sizes,
          keep="frozen CLIP-style ViT (quick GELU, post-embedding LN, penultimate layer's "
               "patches), MLP projector, LLaMA text model"),
    _yaml("multimodal_simple",
          "multimodal/multimodal_simple/configs/params_mm_llava_llama2_7b_phase2.yaml",
          model="multimodal.multimodal_simple.model.MMSimpleModel", batches=mms_batches,
          adjust=projector_sizes,
          keep="frozen ViT and LLaMA, trained projector, image features scattered at "
               "given positions"),
    _yaml("fc_mnist", "vision/fc_mnist/configs/params_cszoov2.yaml",
          model="vision.fc_mnist.model.MNISTModel", batches=mnist_batches,
          overrides={"depth": LAYERS},
          keep="ReLU MLP, log-softmax + NLL"),
]}
