"""Tiny random models with a tokenizer trained in code: real Hugging Face folders built in a second, for tests.

Two architectures, the two the project ships at full size: Gemma 3 (`tiny-gemma3`: sliding and full attention
layers, a tied unembedding, a BOS token) and Qwen2 (`tiny-qwen2`: biases on q/k/v, an untied head, ChatML's special
tokens and chat template, no BOS), so every engine path is tested on both shapes of model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trainer_backend.models.cache import ensure_folder

TINY_MODEL_NAME = "tiny-gemma3"
TINY_QWEN2_NAME = "tiny-qwen2"

# Gemma's own ids for its special tokens, so code that works with the tiny model sees the same layout as the real one.
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
_SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)
_VOCAB_SIZE = 512  # 4 special tokens, 256 bytes, the rest merges

# Enough English and SQL that the merges are the pieces text-to-SQL prompts are made of.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Answer the question with a single SQL query over the database below.",
    "Question: How many customers live in Berlin?",
    "SELECT COUNT(*) FROM customers WHERE city = 'Berlin';",
    "Question: List the names of all employees hired after 2020, ordered by salary.",
    "SELECT name FROM employees WHERE hire_date > '2020-12-31' ORDER BY salary DESC;",
    "Question: What is the average price of products in each category?",
    "SELECT category, AVG(price) AS average_price FROM products GROUP BY category;",
    "Question: Which orders were placed by customers from France?",
    "SELECT o.id, o.total FROM orders AS o JOIN customers AS c ON o.customer_id = c.id WHERE c.country = 'France';",
    "Question: Show the five most expensive products that are in stock.",
    "SELECT name, price FROM products WHERE stock > 0 ORDER BY price DESC LIMIT 5;",
    "Question: How many students are enrolled in each course with more than ten students?",
    "SELECT course_id, COUNT(student_id) FROM enrollments GROUP BY course_id HAVING COUNT(student_id) > 10;",
    "Question: Find the departments that have no employees.",
    "SELECT d.name FROM departments d LEFT JOIN employees e ON e.department_id = d.id WHERE e.id IS NULL;",
    "Question: What is the total revenue of the year 2023?",
    "SELECT SUM(amount) FROM payments WHERE strftime('%Y', paid_at) = '2023';",
    "Question: Which singers are older than the average singer?",
    "SELECT name, age FROM singer WHERE age > (SELECT AVG(age) FROM singer);",
    "Question: Give the distinct cities of airports in the United States.",
    "SELECT DISTINCT city FROM airports WHERE country = 'United States' AND city IS NOT NULL;",
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, country TEXT);",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), total REAL);",
    "INSERT INTO customers VALUES (1, 'Ana', 'Lisbon', 'Portugal'), (2, 'Jürgen', 'Berlin', 'Germany');",
    "A database is an organised collection of data, stored and accessed electronically.",
    "Each table has columns and rows; a query selects the rows that match a condition.",
    "The model reads the question, looks at the schema, and writes the query that answers it.",
    "If the answer is wrong, the reward is zero; if the result matches the gold query, it is one.",
    "In the morning the students walked to the library, and in the evening they went home.",
    "She said that the weather would be better tomorrow, but it rained for the whole week.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -1",
)


def _trained_bpe(special_tokens: tuple[str, ...]) -> Tokenizer:
    """A byte-level BPE trained on the built-in corpus, the special tokens first; any text round-trips through it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer


def train_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the built-in corpus; any text round-trips through it."""
    tokenizer = _trained_bpe(_SPECIAL_TOKENS)
    # Gemma's tokenizer starts every sequence with <bos>; prompts built for one model then fit the other.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


# Qwen2's special tokens, and its chat format (ChatML) as a template: a turn is <|im_start|>role\ncontent<|im_end|>.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_CHATML_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tiny_chatml_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with Qwen2's special tokens and ChatML chat template; no BOS, as Qwen2's."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_trained_bpe(_CHATML_SPECIAL_TOKENS), eos_token=IM_END, pad_token=ENDOFTEXT
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


# The toy size of both architectures, here and in the engine's tests (tests/support/tiny_models.py): two layers,
# `width` wide, an MLP twice as wide.
TINY_WIDTH = 64


def tiny_qwen2_config(vocab_size: int, width: int = TINY_WIDTH, **changes: object) -> Qwen2Config:
    """Qwen2's architecture (grouped KV heads, q/k/v biases, an untied head) at toy size; `changes` set the rest."""
    shape: dict[str, object] = {
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    return Qwen2Config(vocab_size=vocab_size, **(shape | changes))


def tiny_gemma3_config(vocab_size: int, width: int = TINY_WIDTH, **changes: object) -> Gemma3TextConfig:
    """Gemma 3's architecture (a sliding and a full attention layer, two query heads sharing one key/value head, tied
    embeddings) at toy size; `changes` set the rest."""
    head_dim = width // 2
    shape: dict[str, object] = {
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }
    return Gemma3TextConfig(vocab_size=vocab_size, **(shape | changes))


def build_tiny_model(folder: Path, seed: int = 0, architecture: str = TINY_MODEL_NAME) -> Path:
    """Write a tiny model (`tiny-gemma3` or `tiny-qwen2`) and its tokenizer to `folder`; the same seed gives
    byte-identical files."""
    qwen2 = architecture == TINY_QWEN2_NAME
    tokenizer = train_tiny_chatml_tokenizer() if qwen2 else train_tiny_tokenizer()
    # A private generator state: building must not move the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # The tokenizer's own ids of its special tokens (Qwen2's has no BOS: None).
        ids = {
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
        }
        if qwen2:
            model = Qwen2ForCausalLM(tiny_qwen2_config(len(tokenizer), **ids))
        else:
            model = Gemma3ForCausalLM(tiny_gemma3_config(len(tokenizer), **ids))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _ensure(architecture: str, cache_root: Path, seed: int) -> Path:
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return ensure_folder(
        cache_root / f"{architecture}-{seed}",
        f"{recipe} transformers-{transformers.__version__}",
        lambda scratch: build_tiny_model(scratch, seed, architecture),
    )


def ensure_tiny_model(cache_root: Path, seed: int = 0) -> Path:
    """The tiny Gemma 3 under `cache_root`, built on first use and rebuilt when this recipe or transformers changes."""
    return _ensure(TINY_MODEL_NAME, cache_root, seed)


def ensure_tiny_qwen2(cache_root: Path, seed: int = 0) -> Path:
    """The tiny Qwen2 under `cache_root`, built on first use and rebuilt when this recipe or transformers changes."""
    return _ensure(TINY_QWEN2_NAME, cache_root, seed)
