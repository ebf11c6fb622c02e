#!/usr/bin/env python3
"""Record llama.cpp's tokenizer output as the reference for specserve's tokenizer tests.

Writes, under --out-dir (default tests/data/tokenizer):
  smollm2.jsonl       token ids and detokenised text from llama.cpp (via llama-cpp-python,
                      vocab-only load) for the default model, for a few hundred strings, each
                      with several (add_special, parse_special) combinations;
  smollm2_pre_variants.jsonl
                      the same vocabulary and merges re-labelled with other tokenizer.ggml.pre
                      values (llama3, qwen2, default, gpt-2, starcoder) in throw-away GGUFs, so
                      the other pre-tokenizer regex chains are checked against llama.cpp too;
  smollm2_chat.jsonl  jinja2 renderings of the model's own chat template (and of a Qwen2.5-style
                      ChatML template) for several conversations;
  spm_tiny.gguf       a small synthetic SentencePiece ("llama") vocabulary with byte fallback;
  spm_tiny.jsonl      llama.cpp's tokenisation of ~100 strings with that vocabulary.

The first line of every .jsonl is {"meta": {...}} and includes the command that produced it.
Texts are stored as hex ("hex") because some inputs are deliberately invalid UTF-8; "text" holds
the same string when it is valid UTF-8. "decoded_hex" / "decoded_special_hex" are
llama_detokenize(ids, remove_special=False, unparse_special=False / True).

Usage (from the repository root):
  ~/.cache/specserve/venv/bin/python tools/record_tokenizer_reference.py \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --out-dir tests/data/tokenizer
"""

import argparse
import ctypes
import tempfile
import json
import os
import sys

import jinja2
import jinja2.sandbox
import llama_cpp
import numpy as np
from gguf import GGUFReader, GGUFWriter, TokenType

# ----------------------------------------------------------------------------------------------
# llama.cpp access (low-level API: no context, no weights)

_LOG_CB = llama_cpp.llama_log_callback(lambda level, text, user_data: None)


class Vocab:
    def __init__(self, path):
        llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool):
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        assert n >= 0
        return [int(buf[i]) for i in range(n)]

    def detokenize(self, ids, special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        out = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, size, False, special)
        if n < 0:
            size = -n
            out = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, size, False, special)
        return out.raw[:n]

    def piece(self, token: int, special: bool) -> bytes:
        out = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, out, 256, 0, special)
        assert n >= 0
        return out.raw[:n]

    def meta(self):
        v = self.vocab
        eog = [i for i in range(self.n_tokens) if llama_cpp.llama_vocab_is_eog(v, i)]
        return {
            "vocab_size": self.n_tokens,
            "bos": int(llama_cpp.llama_vocab_bos(v)),
            "eos": int(llama_cpp.llama_vocab_eos(v)),
            "eot": int(llama_cpp.llama_vocab_eot(v)),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
            "eog_ids": eog,
        }


# ----------------------------------------------------------------------------------------------
# Test strings

def bpe_strings():
    s = []
    # Basics and spacing.
    s += ["", " ", "  ", "   ", "a", "A", "Hello", "Hello world", " Hello", "Hello ", "hello world!",
          "HELLO WORLD", "Hello, world! How are you?", "The quick brown fox jumps over the lazy dog.",
          "a b c d e f g", "aaaaaaaaaaaaaaaaaaaa", "ab ab ab ab", "x" * 300, " " * 64, "a" + " " * 17 + "b",
          "word   word", "trailing   ", "   leading", "mid  dle", "..."]
    # Contractions (the pre-tokenizer lists lower-case ones only).
    s += ["I'm", "don't", "they're", "we've", "I'll", "he'd", "it's", "IT'S", "I'M", "Don'T", "can't've",
          "'s", "''", "' s", "'", "rock 'n' roll", "O'Neil's", "'re'", "ma'am", "y'all'd've", " 's", "a's b's"]
    # Numbers.
    s += ["1", "12", "123", "1234", "12345", "123456789", "3.14159", "1,000,000", "2024-01-01", "0x1F",
          "1e-10", "-42", "+7", "100%", "$19.99", "٣٤٥", "①②③", "Ⅻ", "१२३", "½", "x²+y³", "99 bottles",
          "a1b2c3", "v1.2.3", "12:30:45", "1000000000000000000000"]
    # Whitespace and control characters.
    s += ["\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n ", "a\n\nb", "a\tb", "a\t\tb", "    indented",
          "line1\nline2\nline3", "a  \n  b", "\u00a0", "a\u00a0b", "\u3000", "a\u3000b", "\u2028", "\u0085",
          "\u180e", "a\u180eb", "\u200b", "a\u200bb", "\x0b", "\x0c", "\x1c\x1d", "\x00", "a\x00b", "\x7f",
          " \t \n", "\n \n", "tab\there", "\r", "end\n"]
    # Scripts, accents, emoji.
    s += ["café", "naïve", "Ñandú", "Straße", "Привет, мир!", "Γειά σου Κόσμε", "שלום עולם",
          "مرحبا بالعالم", "你好，世界", "日本語のテキストです。", "한국어 텍스트", "ภาษาไทย", "हिन्दी भाषा",
          "Tiếng Việt", "ქართული", "Ελληνικά και English", "emoji 😀", "😀😃😄😁", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵",
          "❤️", "a😀b", "e\u0301", "Zalgo: Z̷̢a̵l̶g̴o̷", "ﬁ ligature", "Ｆｕｌｌｗｉｄｔｈ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
          "\U00031350\U00031351", "\U0001E4D0\U0001E4D1", "\U0001FAE8 shaking face", "\U00011F50",
          "\ue000 private", "\ufffd", "mixed 中文 and English 和数字123"]
    # Code and markup.
    s += [
        "def foo(x):\n    return x * 2\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "https://example.com/path?query=1&b=2#frag",
        "user.name+tag@example.co.uk",
        "^(?:[a-z0-9]+)\\s*$",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "$\\frac{a}{b} + \\sum_{i=0}^{n} x_i$",
        "#include <vector>\nint main() { return 0; }",
        "SELECT * FROM users WHERE id = 42;",
        "    if x:\n        pass\n    else:\n        raise",
        "```python\nprint('hi')\n```",
        "x+=1;y-=2;z*=3;w/=4",
        "a==b!=c<=d>=e",
        "->  =>  ::  ...  ??  !!",
        "// comment\n/* block */",
        "@decorator\nclass A(B): pass",
        "~/.bashrc && ls -la | grep x",
    ]
    # Text that looks like (or is) special tokens.
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
          "<|im_end|>\n", "<reponame>x<file_sep>y", "<|im_start", "<|im_start|", "im_start|>", "<s>", "</s>",
          "<|IM_START|>", " <|im_start|>", "<|im_start|><|im_end|>", "<|endoftext|><|endoftext|>",
          "text<|endoftext|>more", "<jupyter_code>print(1)<jupyter_output>1", "<<|im_start|>>",
          "<|im_start|>user <|im_end|> ", "<gh_stars>100", "<|endoftext|>\n\n<|endoftext|>", "<|>", "<||>"]
    # Longer prose.
    s += [
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
        "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco.",
        "In 1969, Apollo 11 landed on the Moon; Neil Armstrong said: \"That's one small step for "
        "[a] man, one giant leap for mankind.\"",
        "Speculative decoding lets a small draft model propose tokens that a large target model "
        "verifies in one forward pass.\n\nIt's exact: the output distribution is unchanged!",
        "Q: What's 2+2?\nA: 4.\n\nQ: And 10*10?\nA: 100.",
        "Mixed: English, Français, Deutsch, Español, Русский, 中文, 日本語, 한국어, العربية.",
    ]
    # Every printable ASCII character alone, then Latin-1 and a few other single code points.
    s += [chr(c) for c in range(0x20, 0x7F)]
    s += [chr(c) for c in range(0xA0, 0x100)]
    s += [chr(c) for c in range(1, 0x20) if chr(c) not in s]
    # Invalid UTF-8 and other raw bytes (stored as bytes).
    raw = [b"\xff", b"\xfe", b"\xc3", b"\xc3\x28", b"\x80", b"\x80\x80", b"\xed\xa0\x80", b"\xc0\x80",
           b"a\xffb", b"\xe2\x82", b"\xe2\x82a", b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\xf8\x88\x80\x80\x80",
           b"ok \xc3\xa9\xc3", b"\xef\xbb\xbfBOM", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xbf\xbf\xbf hello"]
    out, seen = [], set()
    for x in s + raw:
        b = x if isinstance(x, bytes) else x.encode("utf-8")
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def spm_strings():
    s = ["", " ", "  ", "a", "Hello", "Hello world", " Hello world", "hello  world", "Hello world ",
         "the cat sat on the mat", "The Cat Sat", "there then these those", "in the end", "and another thing",
         "testing tokenization", "running jumping swimming", "an apple a day", "information retrieval",
         "\n", "\n\n", "a\nb", "\t", "a\tb", "line one\nline two", "    four spaces", "x  y   z",
         "é", "café", "naïve résumé", "中文", "中文 text", "日本", "😀", "a😀b", "Привет", "مرحبا", "ñ",
         "123", "3.14", "2024", "1 2 3", "$100", "50%", "hello, world!", "what?", "yes.", "(parens)",
         "[brackets]", "{braces}", "a-b_c", "snake_case_name", "CamelCaseName", "ALLCAPS", "mIxEd",
         "<s>", "</s>", "<unk>", "<s>hello</s>", "hello</s>", "<|user|>hi", "<|user|> hi <|user|>",
         "say <|im_start|> now", "<|im_start|>", "<0x41>", "<0xFF>", "▁", "▁▁", "a▁b", "\u2581hello",
         "the the the the", "eeeeeeeeee", "thethethe", "at at at", "ing ing", "tion", "ation nation",
         "Hello, World! This is a longer sentence to tokenize with the tiny vocabulary.",
         "def f(x): return x", "if (a && b) { c(); }", "key: value", "a=b", "~`!@#$%^&*", "'quoted'",
         '"double"', "it's", "don't stop", "e\u0301", "\u00a0", "\u3000", "\x00", "\x7f", "end."]
    raw = [b"\xff", b"\xc3", b"a\xffb", b"\xe2\x82", b"\x80", b"\xf0\x9f\x98"]
    out, seen = [], set()
    for x in s + raw:
        b = x if isinstance(x, bytes) else x.encode("utf-8")
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def record(vocab, strings, combos, path, meta):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for b in strings:
            try:
                text = b.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            for add_special, parse_special in combos:
                ids = vocab.tokenize(b, add_special, parse_special)
                rec = {
                    "hex": b.hex(),
                    "text": text,
                    "add_special": add_special,
                    "parse_special": parse_special,
                    "ids": ids,
                    "decoded_hex": vocab.detokenize(ids, False).hex(),
                    "decoded_special_hex": vocab.detokenize(ids, True).hex(),
                }
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(strings)} strings x {len(combos)} combinations")


def piece_samples(vocab, ids):
    return [[i, vocab.piece(i, True).hex(), vocab.piece(i, False).hex()] for i in ids]


# ----------------------------------------------------------------------------------------------
# Synthetic SentencePiece vocabulary

SPM_CORPUS = (
    "the cat sat on the mat and the dog ran in the park . hello world this is a test of the tiny "
    "vocabulary with some words that repeat : the then there these those this that testing tokens "
    "tokenization running jumping swimming information retrieval nation station apple day another "
    "thing end line one two four spaces longer sentence Hello World The This Cat Sat"
)


def build_spm_vocab():
    """Returns (tokens, scores, types): <unk> <s> </s>, 256 byte tokens, user-defined/control
    extras, single characters, then pieces learnt by a few BPE-style merges over SPM_CORPUS."""
    sp = "\u2581"
    tokens, scores, types = [], [], []

    def add(text, score, ttype):
        assert text not in tokens, text
        tokens.append(text)
        scores.append(float(score))
        types.append(int(ttype))

    add("<unk>", 0.0, TokenType.UNKNOWN)
    add("<s>", 0.0, TokenType.CONTROL)
    add("</s>", 0.0, TokenType.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, TokenType.BYTE)
    add("<|user|>", 0.0, TokenType.USER_DEFINED)
    add("<|im_start|>", 0.0, TokenType.CONTROL)

    words = [sp + w for w in SPM_CORPUS.split()]
    chars = sorted(set("".join(words)) | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-_:()") | {"é", "中", "文", "ñ"})
    base = -1000.0
    for i, c in enumerate(chars):
        add(c, base - i, TokenType.NORMAL)

    # Greedy pair merges over the corpus words; earlier merges score higher.
    seqs = [list(w) for w in words]
    for rank in range(160):
        counts = {}
        for seq in seqs:
            for a, b in zip(seq, seq[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        (a, b), n = max(counts.items(), key=lambda kv: (kv[1], -len(kv[0][0] + kv[0][1]), kv[0]))
        if n < 2 and rank > 120:
            break
        merged = a + b
        if merged not in tokens:
            add(merged, -float(rank), TokenType.NORMAL)
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if seq[i] == a and seq[i + 1] == b:
                    seq[i:i + 2] = [merged]
                i += 1
    # A few extra whole-word pieces with equal scores to exercise tie-breaking.
    for w in ["\u2581hello", "\u2581world", "ing", "tion", "\u2581\u2581", "\u2581\u2581\u2581\u2581", "ation"]:
        if w not in tokens:
            add(w, -5.0, TokenType.NORMAL)
    return tokens, scores, types


def write_spm_gguf(path):
    tokens, scores, types = build_spm_vocab()
    w = GGUFWriter(path, "llama")
    w.add_name("spm-tiny")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path}: {len(tokens)} tokens, {os.path.getsize(path)} bytes")


def write_bpe_variant(reader, pre, path):
    """Copies the default model's BPE vocabulary into a weightless GGUF with another pre."""
    f = reader.fields
    w = GGUFWriter(path, "llama")
    w.add_name("smollm2-vocab-" + pre)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for key, add in [("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
                     ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
                     ("tokenizer.ggml.padding_token_id", w.add_pad_token_id),
                     ("tokenizer.ggml.add_bos_token", w.add_add_bos_token)]:
        if key in f:
            add(f[key].contents())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


PRE_VARIANTS = ["llama3", "qwen2", "default", "gpt-2", "starcoder"]


# ----------------------------------------------------------------------------------------------
# Chat templates

QWEN_LIKE_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CONVERSATIONS = [
    [],
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "Unicode: café 你好 😀\nsecond line\n"}],
    [{"role": "user", "content": "  padded  "}, {"role": "assistant", "content": "\n\nok\n"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
    [{"role": "user", "content": "<|im_start|>fake<|im_end|>"}],
    [{"role": "tool", "content": "{\"result\": 42}"}],
]


def render(template, messages, add_generation_prompt):
    # Same environment transformers uses for apply_chat_template.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token="", eos_token="<|im_end|>")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out-dir", default="tests/data/tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python tools/record_tokenizer_reference.py " + " ".join(
        f"{k} {v}" for k, v in [("--model", args.model), ("--out-dir", args.out_dir)])
    common = {"command": command, "llama_cpp_python": llama_cpp.__version__}

    # Byte-level BPE: the default model.
    vocab = Vocab(args.model)
    meta = dict(common, model=os.path.basename(args.model), **vocab.meta())
    sample = sorted(set(list(range(64)) + list(range(64, vocab.n_tokens, 97)) + list(range(vocab.n_tokens - 8, vocab.n_tokens))))
    meta["pieces"] = piece_samples(vocab, sample)
    combos = [(False, False), (False, True), (True, True)]
    strings = bpe_strings()
    record(vocab, strings, combos, os.path.join(args.out_dir, "smollm2.jsonl"), meta)

    # Other pre-tokenizers over the same vocabulary.
    reader = GGUFReader(args.model)
    variants_path = os.path.join(args.out_dir, "smollm2_pre_variants.jsonl")
    with tempfile.TemporaryDirectory() as tmp, open(variants_path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": dict(common, model=os.path.basename(args.model), pre=PRE_VARIANTS)}) + "\n")
        for pre in PRE_VARIANTS:
            path = os.path.join(tmp, pre + ".gguf")
            write_bpe_variant(reader, pre, path)
            v = Vocab(path)
            for b in strings:
                ids = v.tokenize(b, False, False)
                f.write(json.dumps({"pre": pre, "hex": b.hex(), "add_special": False, "parse_special": False,
                                    "ids": ids, "decoded_hex": v.detokenize(ids, False).hex(),
                                    "decoded_special_hex": v.detokenize(ids, True).hex()}) + "\n")
    print(f"wrote {variants_path}: {len(PRE_VARIANTS)} pre-tokenizers x {len(strings)} strings")

    # Chat templates.
    template = reader.fields["tokenizer.chat_template"].contents()
    chat_path = os.path.join(args.out_dir, "smollm2_chat.jsonl")
    with open(chat_path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": dict(common, model=os.path.basename(args.model),
                                         templates={"model": template, "qwen_like": QWEN_LIKE_TEMPLATE})},
                           ensure_ascii=False) + "\n")
        n = 0
        for name, tpl in [("model", template), ("qwen_like", QWEN_LIKE_TEMPLATE)]:
            for messages in CONVERSATIONS:
                for agp in (False, True):
                    try:
                        rendered = render(tpl, messages, agp)
                    except jinja2.exceptions.UndefinedError:
                        continue  # e.g. the Qwen-style template reads messages[0] unconditionally
                    f.write(json.dumps({"template": name, "messages": messages, "add_generation_prompt": agp,
                                        "rendered": rendered}, ensure_ascii=False) + "\n")
                    n += 1
    print(f"wrote {chat_path}: {n} renderings")

    # SentencePiece: synthetic vocabulary.
    spm_path = os.path.join(args.out_dir, "spm_tiny.gguf")
    write_spm_gguf(spm_path)
    spm = Vocab(spm_path)
    meta = dict(common, model="spm_tiny.gguf", **spm.meta())
    meta["pieces"] = piece_samples(spm, list(range(spm.n_tokens)))
    record(spm, spm_strings(), [(False, False), (True, False), (False, True), (True, True)],
           os.path.join(args.out_dir, "spm_tiny.jsonl"), meta)


if __name__ == "__main__":
    sys.exit(main())
