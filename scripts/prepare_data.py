#!/usr/bin/env python3
"""Tokenise tinyshakespeare with the GPT-2 BPE into llm.c token shards.

For other text (files, directories, JSON lines) use `flashtrain prepare-data`, whose C++ encoder
gives the same ids (it reproduces these shards from data/tinyshakespeare.txt byte for byte).

This is the script that made the shipped files in data/:

    data/tinyshakespeare_train.bin   llm.c token shard (magic 20240520, version 1, uint16)
    data/tinyshakespeare_val.bin     the first 32768 tokens, same format
    data/gpt2_tokenizer.bin          llm.c tokenizer file (magic 20240328, version 2)

Inputs (checked against their known sha256 before use):

    data/tinyshakespeare.txt, data/gpt2_vocab.json, data/gpt2_merges.txt

The byte-level BPE encoder is written here (it needs only the PyPI package `regex` for the
\\p{L} / \\p{N} classes of GPT-2's pre-tokenisation pattern). The corpus is split into
documents as llm.c's dev/data/tinyshakespeare.py does: split at "\\n\\n", put <|endoftext|>
(50256) before each document, and keep the "\\n\\n" at the end of every document but the last,
so that dropping the <|endoftext|> tokens and decoding gives back the exact text.

Usage:
    python3 scripts/prepare_data.py                 # (re)write the shipped files
    python3 scripts/prepare_data.py --check         # verify the shipped files, write nothing
    python3 scripts/prepare_data.py --source /work/shared/data   # copy the raw inputs first
    python3 scripts/prepare_data.py --uint32 --out-dir /tmp/x    # llama3-style uint32 shards
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from array import array

try:
    import regex
except ImportError:
    sys.exit("error: the Python package 'regex' is required: python3 -m pip install regex")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "data")

# The sha256 values listed in /work/shared/data/README.md.
INPUTS = {
    "tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    "gpt2_vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "gpt2_merges.txt": "ac33235097fe06d4a8fff0feac994644809e6eb6ab70669e1e9fd40ae032428e",
}

# GPT-2's pre-tokenisation: contractions, letter runs, digit runs, other-symbol runs (each with
# an optional leading space), then whitespace (trailing whitespace before a word stays apart).
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

EOT_TEXT = "<|endoftext|>"
EOT_ID = 50256
VOCAB_SIZE = 50257
NUM_MERGES = 50000
VAL_TOKENS = 32768

SHARD_HEADER_INTS = 256
SHARD_FORMATS = {  # tokens are uint16 or uint32 -> (magic, version, array typecode)
    False: (20240520, 1, "H"),
    True: (20240801, 7, "I"),
}
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2

# (text, GPT-2 ids) pairs known from the published tokenizer.
KNOWN_ENCODINGS = [
    ("Hello world", [15496, 995]),
    ("hello world", [31373, 995]),
    (" the", [262]),
    ("\n", [198]),
    ("\n\n", [628]),
]


def bytes_to_unicode():
    """GPT-2's reversible map from each byte to a printable unicode character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, a few
    Latin-1 gaps) map to 256, 257, ... in byte order, so no token string holds whitespace.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class Gpt2Bpe:
    """Byte-level BPE: pre-tokenise, map bytes to unicode symbols, merge by rank, look up ids."""

    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.encoder = json.load(f)
        if len(self.encoder) != VOCAB_SIZE or self.encoder.get(EOT_TEXT) != EOT_ID:
            sys.exit(f"error: {vocab_path}: expected {VOCAB_SIZE} entries with "
                     f"{EOT_TEXT} = {EOT_ID}, found {len(self.encoder)} entries")
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.ranks = {}
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        lines = [line for line in lines if line]
        for rank, line in enumerate(lines):
            parts = line.split(" ")
            if len(parts) != 2:
                sys.exit(f"error: {merges_path}: line {rank + 1} is not 'a b': {line!r}")
            self.ranks[(parts[0], parts[1])] = rank
        if len(self.ranks) != NUM_MERGES:
            sys.exit(f"error: {merges_path}: expected {NUM_MERGES} merges, found {len(self.ranks)}")
        self.split = regex.compile(GPT2_SPLIT)
        self.cache = {}

    def bpe(self, piece):
        """Merge the symbols of one pre-token, always the lowest-ranked adjacent pair first."""
        symbols = list(piece)
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:]):
                rank = self.ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            merged = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self.encoder[s] for s in symbols]

    def encode(self, text):
        """Encode text as ordinary tokens (special tokens in the text are not recognised)."""
        ids = []
        for word in self.split.findall(text):
            cached = self.cache.get(word)
            if cached is None:
                piece = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
                cached = self.bpe(piece)
                self.cache[word] = cached
            ids.extend(cached)
        return ids

    def token_bytes(self, token_id):
        return bytes(self.byte_decoder[c] for c in self.decoder[token_id])

    def decode(self, ids):
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8")


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def sha256_of(path):
    return hashlib.sha256(read_bytes(path)).hexdigest()


def check_inputs(source):
    """Copy the raw inputs from `source` (if given) into data/, then verify every checksum."""
    for name, expected in INPUTS.items():
        dst = os.path.join(DATA, name)
        if source is not None:
            src = os.path.join(source, name)
            if sha256_of(src) != expected:
                sys.exit(f"error: {src}: sha256 differs from the expected {expected}")
            shutil.copyfile(src, dst)
        if not os.path.exists(dst):
            sys.exit(f"error: {dst} is missing (run with --source DIR to copy the raw inputs)")
        found = sha256_of(dst)
        if found != expected:
            sys.exit(f"error: {dst}: sha256 {found} differs from the expected {expected}")


def self_test(bpe):
    for text, expected in KNOWN_ENCODINGS:
        got = bpe.encode(text)
        if got != expected:
            sys.exit(f"error: encoder self-test: {text!r} -> {got}, expected {expected}")


def tokenize_corpus(bpe, text):
    """llm.c's tinyshakespeare.py: one document per "\\n\\n" section, each after an EOT."""
    sections = text.split("\n\n")
    tokens = []
    for i, section in enumerate(sections):
        tokens.append(EOT_ID)
        padded = section + "\n\n" if i != len(sections) - 1 else section
        tokens.extend(bpe.encode(padded))
    return tokens


def shard_bytes(tokens, uint32_tokens):
    magic, version, typecode = SHARD_FORMATS[uint32_tokens]
    limit = 1 << (32 if uint32_tokens else 16)
    if tokens and max(tokens) >= limit:
        sys.exit(f"error: token id {max(tokens)} does not fit the shard's token width")
    header = [0] * SHARD_HEADER_INTS
    header[0], header[1], header[2] = magic, version, len(tokens)
    body = array(typecode, tokens)
    if sys.byteorder != "little":
        body.byteswap()
    return struct.pack(f"<{SHARD_HEADER_INTS}i", *header) + body.tobytes()


def tokenizer_bytes(bpe):
    """llm.c's tokenizer file: 256-int header, then per id one uint8 length and the bytes."""
    header = [0] * SHARD_HEADER_INTS
    header[0], header[1], header[2], header[3] = (TOKENIZER_MAGIC, TOKENIZER_VERSION,
                                                  VOCAB_SIZE, EOT_ID)
    out = [struct.pack(f"<{SHARD_HEADER_INTS}i", *header)]
    for i in range(VOCAB_SIZE):
        b = bpe.token_bytes(i)
        if not 0 < len(b) < 256:
            sys.exit(f"error: token {i} has {len(b)} bytes; the format allows 1..255")
        out.append(struct.pack("<B", len(b)) + b)
    return b"".join(out)


def write_atomic(path, data):
    """Write to a temporary file in the same folder, then rename over the target."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; shipped data is world-readable
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main():
    parser = argparse.ArgumentParser(
        description="Tokenise tinyshakespeare with the GPT-2 BPE into llm.c token shards.")
    parser.add_argument("--check", action="store_true",
                        help="re-encode and verify that the existing outputs are byte-identical; "
                             "write nothing")
    parser.add_argument("--source", metavar="DIR",
                        help="copy the raw inputs from DIR into data/ first (e.g. /work/shared/data)")
    parser.add_argument("--out-dir", metavar="DIR", default=DATA,
                        help="where the shards and tokenizer go (default: the repo's data/)")
    parser.add_argument("--uint32", action="store_true",
                        help="write llm.c's llama3 shard format (magic 20240801, version 7, "
                             "uint32 tokens) instead of 20240520/1/uint16")
    args = parser.parse_args()
    if args.check and args.source:
        parser.error("--check verifies the files as they are; it does not take --source")

    check_inputs(args.source)
    bpe = Gpt2Bpe(os.path.join(DATA, "gpt2_vocab.json"), os.path.join(DATA, "gpt2_merges.txt"))
    self_test(bpe)
    with open(os.path.join(DATA, "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()
    tokens = tokenize_corpus(bpe, text)
    if bpe.decode([t for t in tokens if t != EOT_ID]) != text:
        sys.exit("error: decoding the tokens does not give back the corpus")
    val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]
    print(f"encoded {len(text):,} characters into {len(tokens):,} tokens "
          f"({tokens.count(EOT_ID):,} documents); round trip exact")

    outputs = [
        ("tinyshakespeare_val.bin", shard_bytes(val, args.uint32), f"{len(val):,} tokens"),
        ("tinyshakespeare_train.bin", shard_bytes(train, args.uint32), f"{len(train):,} tokens"),
        ("gpt2_tokenizer.bin", tokenizer_bytes(bpe), f"{VOCAB_SIZE:,} tokens, eot {EOT_ID}"),
    ]
    failed = False
    for name, data, what in outputs:
        path = os.path.join(args.out_dir, name)
        if args.check:
            if not os.path.exists(path):
                print(f"MISSING   {path}")
                failed = True
            elif read_bytes(path) != data:
                print(f"DIFFERENT {path} ({what} expected, {len(data):,} bytes)")
                failed = True
            else:
                print(f"ok        {path} ({what}, {len(data):,} bytes)")
        else:
            write_atomic(path, data)
            print(f"wrote     {path} ({what}, {len(data):,} bytes)")
    if failed:
        sys.exit("error: the shipped files differ from what this script produces")


if __name__ == "__main__":
    main()
