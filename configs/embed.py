"""Embed images into ILIAS-format descriptor files with a converted checkpoint.

Command (ILIAS core, DINOv2-B/14 from a transformers checkpoint; ~10 min on one GPU):
  python launch.py --config=configs/embed.py:dinov2_b14 --workdir=features/dinov2_b14 \\
    --config.model.checkpoint=dinov2-base/model.safetensors \\
    --config.embed.input=ilias_core --config.embed.folder=ilias/core
writes `features_image_queries.hdf5` and `features_positives.hdf5` (5,947 descriptors).

Distractors, only the 5% uniform sample the estimator needs (id hash, as in the scoring engine):
  ... --config.embed.input=tars --config.embed.tars='ilias/yfcc/*.tar' \\
      --config.embed.sample_fraction=0.05
writes one `features_distractors_{k:05d}.hdf5` per `tars_per_file` tars; reruns skip done files.

Presets (`:name`): dinov2_b14, dinov2_l14, dinov2_reg_b14, clip_b16 (OpenAI, transformers),
openclip_b16 (open_clip file), siglip_b16 (SigLIP B/16-256, transformers), siglip_so400m
(SigLIP So400m/14-384), mu (a random tiny model; tests only). Each sets the architecture, the
checkpoint's name table (`model.source`) and the ILIAS evaluation resolution.
"""

from ml_collections import config_dict

from tailaware.configs import default

# name: (family, variant, pos_grid, proj_dim, source, resolution)
PRESETS = {
    "dinov2_b14": ("dinov2", "B/14", 37, 0, "hf_dinov2", 724),
    "dinov2_l14": ("dinov2", "L/14", 37, 0, "hf_dinov2", 724),
    "dinov2_reg_b14": ("dinov2_reg", "B/14", 37, 0, "hf_dinov2", 724),
    "clip_b16": ("clip", "B/16", 14, 512, "hf_clip", 384),
    "openclip_b16": ("openclip", "B/16", 14, 512, "open_clip", 384),
    "siglip_b16": ("siglip", "B/16", 16, 0, "hf_siglip", 384),
    "siglip_so400m": ("siglip", "So400m/14", 27, 0, "hf_siglip", 512),
    "mu": ("dinov2", "mu/14", 2, 0, "hf_dinov2", 56),
}


def get_config(arg=None):
    c = default.get_config()
    c.job = "tailaware.jobs.embed"
    family, variant, pos_grid, proj_dim, source, resolution = PRESETS[arg or "dinov2_b14"]

    c.model = config_dict.ConfigDict()
    c.model.family = family  # see tailaware.models.FAMILIES
    c.model.variant = variant  # "<size>/<patch>", sizes in tailaware.models.SIZES
    c.model.pos_grid = pos_grid  # side of the checkpoint's position grid (518 / 14 = 37)
    c.model.proj_dim = proj_dim  # CLIP projection size; 0 = none
    c.model.source = source  # name table: tailaware.models.TABLES
    c.model.checkpoint = ""  # .safetensors / .bin / .pth; "" = random weights (tests only)
    c.model.resolution = resolution  # longer side in pixels (ILIAS protocol)
    c.model.norm = ""  # "" = the family's; else a key of tailaware.data.preprocess.NORMS
    c.model.act = ""  # "" = the source's convention
    c.model.pos_interp = ""  # "" = the source's convention
    c.model.dtype = "auto"  # bfloat16 on accelerators, float32 on CPU
    c.model.seed = 0  # random init only

    # SigLIP text tower for the text queries (input=ilias_core; skipped while checkpoint is "").
    c.text = config_dict.ConfigDict()
    c.text.variant = "B"  # a size of tailaware.models.SIZES (So400m for SigLIP So400m)
    c.text.checkpoint = ""  # e.g. the SiglipModel safetensors (its text_model.* keys)
    c.text.source = "hf_siglip_text"
    c.text.tokenizer = ""  # tokenizer.json of the same checkpoint
    c.text.vocab_size = 32000  # SigLIP; 256000 for SigLIP2 (Gemma tokenizer)
    c.text.max_len = 64
    c.text.pad_id = 1  # SigLIP pads with </s> (id 1); SigLIP2 with <pad> (id 0)

    c.embed = config_dict.ConfigDict()
    c.embed.input = "ilias_core"  # ilias_core | folder | tars | tfds
    c.embed.folder = ""  # ilias_core / folder
    c.embed.output = ""  # folder / tfds output name; "" = features_images.hdf5 / by split
    c.embed.tars = ""  # glob of webdataset shards
    c.embed.tars_per_file = 10  # ILIAS: 10 tars of 100K = one 1M feature file
    c.embed.first_file = 0  # index of the first distractor file
    c.embed.tfds_name = "ilias_core/images"
    c.embed.tfds_split = "image_queries"
    c.embed.tfds_data_dir = ""
    c.embed.sample_fraction = 1.0  # < 1: only ids with hash below it (tailaware.core.sampling)
    c.embed.sample_seed = 0
    c.embed.batch_size = 64  # global per process; rounded up to a multiple of local devices
    c.embed.num_buckets = 4  # shorter-side levels per orientation
    c.embed.workers = 8  # host decode threads
    c.embed.distributed = False  # call jax.distributed.initialize() (multi-host)
    c.embed.log_every_s = 30.0
    return c
