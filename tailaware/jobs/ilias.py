"""The ILIAS job: a feature folder in, sampled scores and a prediction (or the exact mAP@k) out.

`python launch.py --config=configs/ilias.py --config.features=DIR --config.sample_fraction=F
--workdir=W` writes `W/sampled_scores.npz` and `W/prediction.json` (with its curve and the
hardness artifact); with F = 1 the evaluation is exact (`"estimator": "exact"`, the official
mAP@k, and `report`, the official ILIAS report of `report_spec`'s groups), `W/ranked_top{k}.pkl`
holds the ranked lists in the official pickle layout and `W/reference_counts.npz` the exact
counts that correct a related model's sampled estimate (`tailaware.io.reference_counts`). The
scoring checkpoints in `W/partials/` (an interrupted run resumes from them) are removed once
the results are written. The folder's layout: `tailaware.io.ilias_folder`; the search:
`tailaware.search.scoring`. See `configs/ilias.py`.
"""

import dataclasses
import os
import pickle
import shutil
import time

import jax
import numpy as np
from absl import logging

from tailaware.core.results import Prediction
from tailaware.io import atomic, features, ilias_folder, reference_counts
from tailaware.io import scores as scores_lib
from tailaware.jobs import config as config_lib
from tailaware.protocol import budget, ilias_report, prediction, report
from tailaware.search import census, exact, proxy, scoring


def run(config, workdir: str) -> Prediction | None:
    """Scores `config.features` and writes sampled_scores.npz and prediction.json to workdir.

    Returns the prediction (process 0) or None (other processes).
    """
    settings = config_lib.check_ilias(config, ilias_folder.QUERY_FILES, scoring.BACKENDS)
    if config.distributed:
        jax.distributed.initialize()
    t0 = time.monotonic()
    queries = ilias_folder.read_split(config.features, ilias_folder.QUERY_FILES[config.queries])
    dim = queries.features.shape[1]
    positives = ilias_folder.read_split(config.features, features.POSITIVES, dim=dim)
    shards = ilias_folder.distractor_shards(config.features, dim, config.expected_shards)
    ilias_folder.check_distinct(queries.ids, positives.ids)
    slots, relevant = ilias_folder.ground_truth(queries.ids, positives.ids)
    n_distractors = sum(s.num_rows for s in shards)
    budget.require_sample(float(config.sample_fraction), n_distractors, int(config.min_sample))
    logging.info(
        "%d %s queries, %d positives, %d distractors in %d shards (dim %d)",
        len(queries.ids),
        config.queries,
        len(positives.ids),
        n_distractors,
        len(shards),
        dim,
    )

    m = int(settings.tail.top_m)
    fraction, plan, fingerprint = float(config.sample_fraction), None, ""
    if config.get("proxy", ""):  # a census design: the hash sample at the rest's rate
        share, depth = config_lib.census_options(config)
        plan = census.plan(
            config_lib.proxy_paths(config),
            queries.ids,
            positives.ids,
            shards,
            fraction=fraction,
            seed=int(config.seed),
            census_share=share,
            depth=depth,
            search=proxy.FolderSearch(  # a folder proxy: searched as the run's own search
                queries=ilias_folder.QUERY_FILES[config.queries],
                depth=int(config.get("proxy_depth", proxy.FolderSearch.depth)),
                backend=config.backend,
                block_size=config.block_size,
                matmul_dtype=config.matmul_dtype,
            ),
        )
        budget.require_census_sample(
            fraction,
            plan.design.inclusion,
            plan.design.n_census,
            n_distractors,
            share,
            int(config.min_sample),
        )
        fraction, fingerprint = plan.design.inclusion, f"+census:{plan.digest}"
        logging.info(
            "census of depth %d: %d items (%.2f of the budget, the share rule); the rest "
            "sampled at %.6f",
            plan.design.depth,
            plan.design.n_census,
            plan.design.n_census / (float(config.sample_fraction) * plan.design.best_rank.size),
            fraction,
        )
    m_search = m + (plan.extra if plan else 0)
    backend = scoring.make_backend(
        config.backend, queries.features, m_search, config.block_size, config.matmul_dtype
    )
    all_scores = backend.scores(positives.features)  # [Q, T], the same arithmetic as the search
    pos, fixed = exact.positive_scores(all_scores, slots, relevant)
    spec = scoring.SearchSpec(
        fraction,
        int(config.seed),
        m_search,
        ilias_folder.fingerprint(queries, positives) + fingerprint,
    )
    process, count = jax.process_index(), jax.process_count()
    partials = os.path.join(workdir, "partials")
    mine = scoring.assign_shards(shards, process, count)
    state, n_sample = scoring.score_shards(
        backend,
        pos,
        mine,
        spec,
        block_size=config.block_size,
        checkpoint=os.path.join(partials, f"process_{process:03d}_of_{count:03d}.npz"),
        checkpoint_every_s=config.checkpoint_every_s,
    )
    if process != 0:
        return None
    state, n_sample = scoring.merge_processes(
        partials, count, spec, state, n_sample=n_sample, n_shards=len(shards)
    )
    if n_sample == 0:
        raise ValueError(
            f"{config.features}: no distractor in the {config.sample_fraction} sample of "
            f"{n_distractors}; raise --config.sample_fraction"
        )
    if plan is not None:
        scored = census.score(backend, plan, shards, pos)
        sample = census.systematic(state, n_sample, plan, scored, m)
        state, n_sample = sample.state, sample.n_sample
        census.save(os.path.join(workdir, "design.npz"), plan, n_distractors, int(config.seed))
    counts = np.where(slots >= 0, state.counts, -1)
    scores = _scores(state, pos, slots, fixed, n_sample, queries.ids, workdir)
    if plan is not None:
        scores = dataclasses.replace(
            scores,
            census_counts=scored.counts,
            n_census=plan.design.n_census,
            inclusion=plan.design.inclusion,
            drawn_counts=sample.drawn_counts,
            n_drawn=sample.n_drawn,
        )
    scores_lib.save_scores(os.path.join(workdir, "sampled_scores.npz"), scores)
    n_target = int(config.n_target) or n_distractors
    if config.sample_fraction == 1.0:
        if n_target != n_distractors:
            logging.warning("exact mode evaluates the %d distractors present", n_distractors)
        groups = report_spec(config, queries.ids, positives.ids, slots)
        result = prediction.exact(
            scores, settings.k, n_distractors, settings.metric_list(), report=groups
        )._replace(queries=config.queries)
        lists = exact.ranked_lists(state, all_scores, relevant, positives.ids, shards, k=settings.k)
        lists["query_ids"] = [str(i) for i in queries.ids]
        _write_pickle(os.path.join(workdir, f"ranked_top{settings.k}.pkl"), lists)
        report.write_prediction(result, workdir)
        names = tuple(result.metrics)
        reference_counts.save(
            os.path.join(workdir, "reference_counts.npz"),
            reference_counts.make(
                counts,
                queries.ids,
                ilias_folder.slot_positive_ids(slots, positives.ids),
                n_distractors=n_distractors,
                k=settings.k,
                metric_names=names,
                metric_values=[result.metrics[n].value for n in names],
                source=workdir,
            ),
        )
    else:  # prediction.json, its curve and the hardness artifact
        provenance = {
            "features": config.features,
            "queries": config.queries,
            **config_lib.metadata(config),
        }
        groups = report_spec(config, queries.ids, positives.ids, slots)
        ref = config_lib.reference_inputs(config, scores, settings, n_target)
        result = report.report(
            scores,
            settings,
            n_target,
            workdir,
            metadata=provenance,
            queries=config.queries,
            spec=groups,
            ref=ref,
        )
    # The checkpoints resume an interrupted run; once its results are written they are only
    # disk (tens of MB a process). An interrupted run never gets here and keeps them.
    shutil.rmtree(partials, ignore_errors=True)
    logging.info("scored and evaluated in %.1f s", time.monotonic() - t0)
    return result


def _scores(state, pos, slots, fixed, n_sample, query_ids, source) -> scores_lib.SampledScores:
    """Returns the sampled scores of a finished search."""
    return scores_lib.make_scores(
        state.vals,
        pos,
        np.where(slots >= 0, state.counts, -1),
        n_sample,
        fixed_counts=fixed,
        query_ids=query_ids,
        tail_ids=np.where(np.isfinite(state.vals), state.ids, -1),
        source=source,
    )


def report_spec(config, query_ids, positive_ids, slots) -> ilias_report.ReportSpec:
    """Returns the official report's groups of these queries: scale and clutter from
    `config.positive_info`, else the folder's `positive_ids.txt`
    (`ilias_folder.find_positive_info`), categories from `config.taxonomy`, else ILIAS's for
    ILIAS's instances (`ilias_folder.report_taxonomy`)."""
    path = config.get("positive_info", "") or ilias_folder.find_positive_info(config.features)
    info = ilias_folder.read_positive_info(path) if path else None
    instances = ilias_folder.instance_of(query_ids)
    taxonomy = ilias_folder.report_taxonomy(instances, config.get("taxonomy", ""))
    slot_ids = ilias_folder.slot_positive_ids(slots, positive_ids)
    return ilias_report.build_spec(query_ids, slot_ids, info, taxonomy)


def _write_pickle(path: str, obj: dict) -> None:
    with atomic.atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
