"""Every job's config is checked up front: a bad value is an InputError naming the flag."""

import numpy as np
import pytest

from tailaware.configs import compare as compare_config
from tailaware.configs import default as default_config
from tailaware.configs import embed as embed_config
from tailaware.configs import ilias as ilias_config
from tailaware.configs import predict as predict_config
from tailaware.configs import validate as validate_config
from tailaware.io import scores as scores_lib
from tailaware.io.errors import InputError, MissingInput
from tailaware.jobs import compare, demo, embed, predict, validate
from tailaware.jobs import config as config_lib
from tailaware.jobs import ilias as ilias_job


@pytest.fixture
def scores_file(tmp_path):
    rng = np.random.default_rng(0)
    tail = -np.sort(-rng.uniform(0.2, 0.6, (2, 8)), axis=1)
    pos = rng.uniform(0.7, 0.9, (2, 2))
    path = tmp_path / "s.npz"
    scores_lib.save_scores(path, scores_lib.make_scores(tail, pos, np.zeros((2, 2)), 100))
    return str(path)


def predict_cfg(scores_file, **fields):
    c = predict_config.get_config()
    c.scores, c.n_target = scores_file, 1000
    for name, value in fields.items():
        target = c
        *parents, last = name.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return c


@pytest.mark.parametrize(
    "fields, flag, words",
    [
        ({"k": 0}, "--config.k", "1 <= k <= 10,000, got 0"),
        ({"k": -3}, "--config.k", "got -3"),
        ({"k": config_lib.MAX_K + 1}, "--config.k", "k <= 10,000"),
        ({"n_target": 0}, "--config.n_target", "N >= 1"),
        ({"n_target": -5}, "--config.n_target", "got -5"),
        ({"estimator": "evtt"}, "--config.estimator", "one of ['count'"),
        ({"evt__top_m": 1}, "--config.evt.top_m", "top_m must be >= 2"),
        ({"evt__threshold_quantile": 1.0}, "--config.evt.threshold_quantile", "in (0, 1)"),
        ({"protocol__curve_points": 1}, "--config.protocol.curve_points", ">= 2"),
        ({"protocol__query_replicates": 0}, "--config.protocol.query_replicates", ">= 2"),
        ({"intervals__prior_sd": -1.0}, "--config.intervals.prior_sd", ">= 0"),
        ({"metadata": "{oops"}, "--config.metadata", "not JSON"),
        ({"artifact": "a.npz"}, "--config.scores / --config.artifact", "exactly one"),
    ],
)
def test_predict_config_errors_name_the_flag(tmp_path, scores_file, fields, flag, words):
    with pytest.raises(InputError) as e:
        predict.run(predict_cfg(scores_file, **fields), str(tmp_path / "w"))
    assert str(e.value).startswith(flag) and words in str(e.value), str(e.value)
    assert not (tmp_path / "w").exists()  # refused before any work


def test_missing_files_and_unknown_fields_name_the_flag(tmp_path, scores_file):
    with pytest.raises(MissingInput, match=r"^--config.scores=.*nope.npz: no such file"):
        predict.run(predict_cfg(str(tmp_path / "nope.npz")), str(tmp_path))
    c = predict_cfg(scores_file)
    with c.unlocked():
        c.evt.top_mm = 3
    with pytest.raises(InputError, match=r"^--config.evt.top_mm: unknown field; expected one of"):
        predict.run(c, str(tmp_path))
    c = predict_cfg(scores_file)
    c.protocol.blocks = (scores_file, str(tmp_path / "gone.npz"))
    with pytest.raises(MissingInput, match=r"^--config.protocol.blocks\[1\]=.*gone.npz"):
        predict.run(c, str(tmp_path))


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("sample_fraction", 0.0, "--config.sample_fraction"),
        ("sample_fraction", 1.5, "--config.sample_fraction"),
        ("n_target", -1, "--config.n_target"),
        ("queries", "audio", "--config.queries"),
        ("backend", "gpu", "--config.backend"),
        ("matmul_dtype", "int8", "--config.matmul_dtype"),
        ("block_size", 0, "--config.block_size"),
        ("expected_shards", -1, "--config.expected_shards"),
    ],
)
def test_ilias_config_errors_name_the_flag(tmp_path, field, value, flag):
    c = ilias_config.get_config()
    c.features = str(tmp_path)
    c[field] = value
    with pytest.raises(InputError, match=f"^{flag}: expected .*got {value!r}"):
        ilias_job.run(c, str(tmp_path / "w"))
    c = ilias_config.get_config()
    c.features = str(tmp_path / "none")
    with pytest.raises(MissingInput, match=r"^--config.features=.*none': no such folder"):
        ilias_job.run(c, str(tmp_path / "w"))


def test_demo_compare_validate_and_embed_configs_are_checked(tmp_path, scores_file):
    c = default_config.get_config()
    c.demo.sample_fraction = 0.0
    with pytest.raises(InputError, match=r"^--config.demo.sample_fraction: expected .*\(0, 1\]"):
        demo.run(c, str(tmp_path))
    c = default_config.get_config()
    c.demo.sizes = (1000, 0)
    with pytest.raises(InputError, match=r"^--config.demo.sizes"):
        demo.run(c, str(tmp_path))

    c = compare_config.get_config()
    c.a, c.b = scores_file, scores_file
    with pytest.raises(InputError, match=r"^--config.n_target: expected N >= 1"):
        compare.run(c, str(tmp_path))
    c.n_target, c.replicates = 1000, 0
    with pytest.raises(InputError, match=r"^--config.replicates: expected .*>= 1, got 0"):
        compare.run(c, str(tmp_path))

    c = validate_config.get_config()
    c.validate.regimes = ("paper", "nope")
    with pytest.raises(InputError, match=r"^--config.validate.regimes: regimes holds 'nope'"):
        validate.run(c, str(tmp_path))

    c = embed_config.get_config("mu")
    c.embed.input, c.embed.folder = "folder", str(tmp_path / "images")
    with pytest.raises(MissingInput, match=r"^--config.embed.folder=.*images'"):
        embed.run(c, str(tmp_path))
    c.embed.folder, c.embed.sample_fraction = str(tmp_path), 2.0
    with pytest.raises(InputError, match=r"^--config.embed.sample_fraction"):
        embed.run(c, str(tmp_path))
    c.embed.sample_fraction, c.model.source = 1.0, "hf_nope"
    with pytest.raises(InputError, match=r"^--config.model.source: expected one of"):
        embed.run(c, str(tmp_path))
    c.model.source, c.model.checkpoint = "hf_dinov2", str(tmp_path / "w.safetensors")
    with pytest.raises(MissingInput, match=r"^--config.model.checkpoint=.*w.safetensors"):
        embed.run(c, str(tmp_path))


def test_metrics_are_selected_by_name_with_commas_or_a_tuple():
    # The flag parser hands "--config.metrics=a,b" over as the tuple ("a,b",).
    cfg = predict_config.get_config()
    for value in (
        ("map,recall,map_at_r,r_precision",),
        ("map", "recall", "map_at_r", "r_precision"),
    ):
        cfg.metrics = value
        got = config_lib.predict_settings(cfg)
        assert got.metrics == ("map", "recall", "map_at_r", "r_precision")
        labels = [m.label(got.k) for m in got.metric_list()]
        assert labels == [f"map@{got.k}", f"recall@{got.k}", "map_at_r", "r_precision"]
    cfg.metrics = ("map,mapr",)
    with pytest.raises(InputError, match="--config.metrics.*map_at_r"):
        config_lib.predict_settings(cfg)
