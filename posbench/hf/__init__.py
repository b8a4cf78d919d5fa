"""Pretrained Hugging Face Llama models in posbench: context extension and evaluation.

The TAPE paper's third experiment extends Llama-2 7B from 4096 to 8192 tokens with TAPE as a
parameter-efficient fine-tune, against LoRA, LongLoRA and RoPE theta scaling. This package does that through
``transformers`` (module composition and its attention interface; no library source is edited or patched)
and ``peft``:

=================  ===========================================================================================
``loading``        load and check a ``LlamaForCausalLM`` and its tokenizer (local directory, or hub when online)
``rope``           linear position interpolation and RoPE theta, written into ``config.rope_parameters``
``tape_llama``     TAPE inside Llama: state from the model's rotary table, attention and MLP updates, KV cache
``s2attn``         LongLoRA's shifted sparse attention, registered in transformers' ``AttentionInterface``
``methods``        ``tape``, ``lora``, ``longlora``, ``theta``: conversion, trainable set, parameter formulas
``saving``         save an extended model (``save_pretrained`` + method tensors) and load it back exactly
``adapter``        a Hugging Face model behind posbench's model interface (engine, tasks, greedy decoding)
``extend``         the ``posbench extend`` run: configure, convert, fine-tune with the engine, save, result
``runs``           a Llama (extended or not) as ``posbench run --init`` for ``perplexity`` and ``passkey``
``memory``         the memory estimate for real sizes and its measurement on small models
``tiny``           a tiny random Llama with a tokenizer, for tests and a first try
=================  ===========================================================================================

Importing ``posbench.hf`` imports nothing heavy; each module imports ``transformers`` / ``peft`` itself.
"""
