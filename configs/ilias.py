"""Score an ILIAS-format feature folder: sampled scores and a prediction, or the exact mAP@k.

Command:
  python launch.py --config=configs/ilias.py --config.features=DIR \
      --config.sample_fraction=0.05 --workdir=W
Writes W/sampled_scores.npz, W/prediction.json, its curve and the hardness artifact
W/hardness.npz (`n_target` defaults to the number of distractors in DIR). With
--config.sample_fraction=1.0 the evaluation is exact: prediction.json has "estimator": "exact"
and `map` is the official mAP@k, `report` the official ILIAS report (scale and clutter from
positive_ids.txt, categories from ILIAS's taxonomy), and W/ranked_top1000.pkl holds the ranked
lists in the official pickle layout. --config.queries=text scores the text queries.
Runtime: dominated by the matmul, Q x D x (scored distractors) x 2 flops (docs/ilias.md).
"""

from tailaware.configs import default


def get_config(arg=None):
    c = default.get_config(arg)
    c.job = "tailaware.jobs.ilias"
    c.features = ""  # the ILIAS-format feature folder
    c.queries = "image"  # "image" or "text"; evaluated separately, never averaged
    c.sample_fraction = 0.05  # uniform distractor sample (tailaware.core.sampling); 1.0 = exact
    # Refuse a sample of fewer distractors (sample_fraction x the folder's): below it the
    # interval's coverage is not established (protocol/budget.MIN_SAMPLE); 0: no floor.
    c.min_sample = 10_000
    # "auto": jax on accelerators, faiss for JAX on CPU with a GPU for faiss, else host;
    # or "host", "jax", "faiss" (`tailaware/search/backends.choose_backend`).
    c.backend = "auto"
    c.matmul_dtype = "float16"  # jax backend inputs: float16, bfloat16 or float32
    c.block_size = 32768  # distractor rows per block
    c.expected_shards = 0  # fail unless exactly this many shards (0: what the folder holds)
    c.checkpoint_every_s = 60.0  # write the per-process partial at most this often
    c.distributed = False  # call jax.distributed.initialize() (multi-host)
    # The exact report's inputs: CSV id,scale,clutter ("": positive_ids.txt in `features`, else
    # in features/image_ids/) and a taxonomy JSON ("": ILIAS's, for ILIAS's instances).
    c.positive_info = ""
    c.taxonomy = ""
    c.metadata = ""  # JSON object kept in the hardness artifact, e.g. '{"model": "dinov2_b14"}'
    # A related model's exact run (an exact ILIAS run's reference_counts.npz) and its sampled
    # scores of the same sample correct the prediction (docs/estimators.md); both or neither.
    c.reference = ""
    c.reference_scores = ""
    c.reference_replicates = 50  # joint bootstrap replicates, each reruns the estimator once
    # Proxies: other models' similarity files (official layout) or ILIAS-format feature folders
    # (any dimension; each query's top lists found by an exact search with the run's backend,
    # block_size and matmul_dtype), comma-separated, plan a census of the items they rank high,
    # the rest sampled uniformly; sample_fraction stays the total embedded share
    # (docs/estimators.md, "Census"; docs/outputs.md, "Similarity files (proxies)").
    c.proxy = ""
    c.census_share = 0.5  # the most of the budget the census may take (less with many queries)
    c.census_depth = 0  # a fixed census depth (0: the deepest the share allows)
    # A feature folder proxy's list depth k per query, the deepest the census can go: the rule
    # needs about census_share x sample_fraction x N / Q when the queries' lists are disjoint
    # (deeper when they overlap). 1000: the official similarity files' k.
    c.proxy_depth = 1000
    return c
