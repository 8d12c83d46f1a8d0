"""The base models the training server serves: resolving a name to a local Hugging Face folder, and loading it.

`registry.resolve_base_model` turns a name (Gemma 3 270M, the Qwen2.5-Coder Instruct models, the tiny test models, or
a local folder) into a folder, building or converting it once per machine; `loading.load_base_model` puts it on a
device with its tokenizer.
"""
