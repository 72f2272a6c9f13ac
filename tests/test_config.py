from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from seqrec.config import (
    DataConfig,
    EvalConfig,
    RunConfig,
    ShortBudget,
    config_diff,
    config_names,
    from_dict,
    load_config,
    parse_duration,
)
from seqrec.errors import ConfigError
from seqrec.training.policy import apply_device_tiers, apply_short_budget, as_trained, refit_config


def test_defaults_file_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[data]\nmin_user_interactions = 3\n[eval]\nprotocols = ["full"]\n')
    cfg = load_config(RunConfig, f, ["data.min_user_interactions=7", "eval.ks=[1, 20]"])
    assert cfg.data == DataConfig(min_user_interactions=7)
    assert cfg.eval == EvalConfig(protocols=("full",), ks=(1, 20))


def test_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.data: unknown key\(s\) colour"):
        load_config(RunConfig, None, ["data.colour=1"])
    with pytest.raises(
        ConfigError, match=r"config\.data\.min_user_interactions: expected an integer"
    ):
        load_config(RunConfig, None, ["data.min_user_interactions=five"])
    with pytest.raises(ConfigError, match="no such config file, and not a shipped config"):
        load_config(RunConfig, tmp_path / "none.toml")
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_config(RunConfig, None, ["nonsense"])


def test_configs_are_frozen() -> None:
    cfg = RunConfig()
    with pytest.raises(AttributeError):
        cfg.data.min_user_interactions = 3  # type: ignore[misc]


def test_shipped_configs_parse_by_name() -> None:
    names = config_names()
    assert {
        "ml-1m",
        "ml-1m-bert4rec",
        "ml-20m-bert4rec",
        "beauty-bert4rec",
        "steam-bert4rec",
    } <= set(names)
    # it documents the defaults, and the papers' 5-core for any ML-1M file it is used with
    papers = DataConfig(min_user_interactions=5, min_item_interactions=5)
    assert load_config(RunConfig, "ml-1m") == RunConfig(data=papers)
    # §4.3: N = 200 / 50 and ρ = 0.2 (MovieLens), 0.4 (Steam), 0.6 (Beauty); L = 2, h = 2, d = 64
    paper = {"ml-1m": (200, 0.2), "ml-20m": (200, 0.2), "steam": (50, 0.4), "beauty": (50, 0.6)}
    for name, (n, rho) in paper.items():
        cfg = load_config(RunConfig, f"{name}-bert4rec")
        assert (cfg.bert4rec.max_len, cfg.cloze.mask_prob) == (n, rho), name
        assert (cfg.bert4rec.n_layers, cfg.bert4rec.n_heads, cfg.bert4rec.d_model) == (2, 2, 64)
    # SASRec §IV-C: n = 200 and dropout 0.2 on ML-1M, n = 50 and 0.5 on Beauty; d = 50, b = 2
    for name, (n, p) in {"ml-1m-sasrec": (200, 0.2), "beauty-sasrec": (50, 0.5)}.items():
        s = load_config(RunConfig, name)
        assert (s.sasrec.max_len, s.sasrec.dropout, s.sasrec.d_model) == (n, p, 50), name
        assert (s.train.loss, s.train.n_negatives, s.train.lr) == ("bce", 1, 1e-3), name
    for name in names:
        load_config(RunConfig, name)


def test_the_recipe_differs_from_the_paper_config_where_documented() -> None:
    recipe = load_config(RunConfig, "ml-1m-bert4rec")
    paper = load_config(RunConfig, "ml-1m-bert4rec-paper")
    changed = {d.split(":")[0] for d in config_diff(recipe, paper)}
    # docs/results/bert4rec.md, "The ML-1M recipe": the schedule, batch, dropout, windows,
    # packing, speed
    assert changed == {
        "bert4rec.attn_dropout",
        "bert4rec.dropout",
        "bert4rec.dropout_impl",
        "bert4rec.out_bias_init",
        "cloze.pack",
        "cloze.sliding_step",
        "train.batch_size",
        "train.decay",
        "train.decay_start",
        "train.eval_every",
        "train.loss_bf16",
        "train.lr",
        "train.max_epochs",
        "train.max_steps",
        "train.time_budget",
        "train.warmup_steps",
        "short_budget",
    }
    # the measured 60-minute recipe (results/bert4rec/bert4rec_ml1m.md): dropout 0.1; none where the
    # budget buys under 120 epochs, and N = 100 under 50 (results/bert4rec_ml1m_maxlen*.md)
    assert (recipe.bert4rec.dropout, recipe.train.time_budget) == (0.1, "60m")
    assert recipe.short_budget[:2] == (
        ShortBudget(epochs=120, set=("bert4rec.dropout=0.0",)),
        ShortBudget(epochs=50, set=("bert4rec.max_len=100",)),
    )
    assert recipe.short_budget[2].device == "cuda"  # the GPU's settings (tested below)
    assert (recipe.train.lr, recipe.train.batch_size, recipe.train.decay_start) == (2e-3, 128, 0.5)


def test_literal_keys_and_base_config() -> None:
    with pytest.raises(ConfigError, match=r"bert4rec\.init: 'uniform' is not one of"):
        load_config(RunConfig, None, ['bert4rec.init="uniform"'])
    base = load_config(RunConfig, None, ["train.lr=0.01", "bert4rec.max_len=50"])
    cfg = load_config(RunConfig, None, ["train.batch_size=8"], base=base)
    assert (cfg.train.lr, cfg.bert4rec.max_len, cfg.train.batch_size) == (0.01, 50, 8)


def test_parse_duration() -> None:
    assert parse_duration("20m") == 1200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90
    assert parse_duration("45") == 45
    assert parse_duration("0.5s") == 0.5
    for bad in ("soon", "10x", "m", "0"):
        with pytest.raises(ConfigError, match="time budget"):
            parse_duration(bad)


def test_the_paper_config_is_the_original_ml1m_schedule() -> None:
    cfg = load_config(RunConfig, "ml-1m-bert4rec-paper")
    t = cfg.train
    # §4.3 and run_ml-1m.sh: lr 1e-4, batch 256, 400,000 steps, 100 warm-up, linear decay
    assert (t.lr, t.batch_size, t.max_steps, t.warmup_steps) == (1e-4, 256, 400_000, 100)
    assert (t.decay, t.decay_shape, t.decay_start, t.time_budget) == ("epochs", "linear", 0.0, None)
    b = cfg.bert4rec  # bert_config_ml-1m_64.json: dropout 0.2 on hidden states and attention
    assert (b.dropout, b.attn_dropout, b.head_norm, b.head_transform) == (0.2, 0.2, True, True)
    c = cfg.cloze
    assert (c.mask_prob, c.max_predictions, c.last_item_ratio, c.sliding_step) == (
        0.2,
        40,
        0.1,
        0.5,
    )


_MINUTE_TIERS = (
    'short_budget=[{minutes = 30, set = ["bert4rec.dropout=0.0"]}, '
    '{minutes = 10, set = ["bert4rec.max_len=100"]}]'
)


def test_short_budget_tiers_apply_under_their_minutes_and_explicit_keys_win() -> None:
    def trained(*sets: str) -> tuple[float, int]:
        b = as_trained(load_config(RunConfig, "ml-1m-bert4rec", [_MINUTE_TIERS, *sets])).bert4rec
        return b.dropout, b.max_len

    assert trained() == (0.1, 200)  # the config's own 60 minutes
    assert trained('train.time_budget="30m"') == (0.1, 200)  # from 30 minutes on: the same
    assert trained('train.time_budget="29m59s"') == (0.0, 200) == trained('train.time_budget="10m"')
    assert trained('train.time_budget="9m"') == (0.0, 100) == trained('train.time_budget="5m"')
    # a key given explicitly wins over its short-budget setting; the others still apply
    assert trained('train.time_budget="5m"', "bert4rec.max_len=150") == (0.0, 150)
    assert trained('train.time_budget="5m"', "short_budget=[]") == (0.1, 200)  # no tiers
    recipe = load_config(RunConfig, "ml-1m-bert4rec", [_MINUTE_TIERS])
    unbudgeted = dataclasses.replace(
        recipe, train=dataclasses.replace(recipe.train, time_budget=None)
    )
    assert apply_short_budget(unbudgeted) == unbudgeted  # no budget: nothing is short
    # applied once: the run's config.json holds the result, and reading it back changes nothing
    five = load_config(RunConfig, "ml-1m-bert4rec", [_MINUTE_TIERS, 'train.time_budget="5m"'])
    short = apply_short_budget(five)
    assert [t.applied for t in short.short_budget] == [True, True]
    assert (short.bert4rec.dropout, short.bert4rec.max_len) == (0.0, 100)
    assert apply_short_budget(short) == short
    again = load_config(RunConfig, None, ['train.time_budget="1h"'], base=short)
    assert as_trained(again).bert4rec.max_len == 100  # a resolved config stays as it trained
    stored = json.loads(json.dumps(short.to_dict()))["short_budget"]
    assert stored[1] == {
        "minutes": 10.0,
        "epochs": 0.0,
        "device": "",
        "set": ["bert4rec.max_len=100"],
        "applied": True,
        "bought": None,
        "on": None,
    }
    middle = apply_short_budget(
        load_config(RunConfig, "ml-1m-bert4rec", [_MINUTE_TIERS, 'train.time_budget="15m"'])
    )
    assert [t.applied for t in middle.short_budget] == [True, False]


def test_epochs_tiers_are_decided_by_the_epochs_the_budget_buys_measured_once() -> None:
    calls: list[int] = []

    def run(bought: float, *sets: str) -> RunConfig:
        def measure(cfg: RunConfig) -> float:
            calls.append(cfg.bert4rec.max_len)  # the config as given is timed
            return bought

        return apply_short_budget(load_config(RunConfig, "ml-1m-bert4rec", list(sets)), measure)

    def trained(bought: float, *sets: str) -> tuple[float, int]:
        b = run(bought, *sets).bert4rec
        return b.dropout, b.max_len

    assert trained(400) == (0.1, 200) == trained(120)  # tiers: under 120 and under 50 epochs
    assert trained(119.9) == (0.0, 200) == trained(50)
    assert trained(49.9) == (0.0, 100) == trained(3)
    assert calls == [200] * 6  # one timing a run, of N = 200
    # an explicit key wins; no tiers, no budget, or every tier's key explicit: nothing is timed
    assert trained(3, "bert4rec.max_len=150") == (0.0, 150)
    calls.clear()
    assert trained(3, "short_budget=[]") == (0.1, 200)
    unbudgeted = load_config(RunConfig, "ml-1m-bert4rec", ["train.max_epochs=5"])
    unbudgeted = dataclasses.replace(
        unbudgeted, train=dataclasses.replace(unbudgeted.train, time_budget=None)
    )
    assert apply_short_budget(unbudgeted, lambda cfg: 3.0) == unbudgeted
    assert trained(3, "bert4rec.max_len=150", "bert4rec.dropout=0.3") == (0.3, 150)
    assert calls == []
    # config.json records the decision and what was measured; it is never made twice
    short = run(31.254)
    tiers = [(t.applied, t.bought) for t in short.short_budget]
    assert tiers == [(True, 31.25), (True, 31.25), (False, None)]  # the device tier: undecided
    assert apply_short_budget(short, lambda cfg: 1000.0) == short
    middle = run(91.0)
    tiers = [(t.applied, t.bought) for t in middle.short_budget]
    assert tiers == [(True, 91.0), (False, 91.0), (False, None)]
    stored = from_dict(RunConfig, json.loads(json.dumps(middle.to_dict())))
    assert stored == middle
    # the settings a config trains with: without a run to go by, its epochs tiers are left out;
    # with one, as that run decided them (so the run is reused)
    given = load_config(RunConfig, "ml-1m-bert4rec")
    assert (as_trained(given).bert4rec.dropout, as_trained(given).bert4rec.max_len) == (0.1, 200)
    like = as_trained(given, like=middle).bert4rec
    assert (like.dropout, like.max_len) == (0.0, 200)
    assert as_trained(given, like=middle) == as_trained(middle)


def test_short_budget_settings_are_checked_when_the_config_is_loaded() -> None:
    def tier(minutes: float, setting: str) -> str:
        return f"short_budget=[{{minutes = {minutes}, set = [{json.dumps(setting)}]}}]"

    with pytest.raises(ConfigError, match=r"^short_budget\.minutes: expected >= 0, got -1"):
        load_config(RunConfig, None, [tier(-1, "bert4rec.max_len=100")])
    with pytest.raises(ConfigError, match=r"^short_budget\.set: 'train\.time_budget=1' cannot"):
        load_config(RunConfig, None, [tier(5, "train.time_budget=1")])
    with pytest.raises(
        ConfigError,
        match=r"^config: short_budget\.set: config\.bert4rec: unknown key\(s\) max_lenn",
    ):
        load_config(RunConfig, None, [tier(5, "bert4rec.max_lenn=100")])
    with pytest.raises(ConfigError, match=r"^short_budget\.epochs: expected >= 0, got -2"):
        load_config(RunConfig, None, ['short_budget=[{epochs = -2, set = ["train.lr=1"]}]'])
    with pytest.raises(ConfigError, match=r"^short_budget: a tier is due by minutes, by epochs or"):
        load_config(
            RunConfig, None, ['short_budget=[{epochs = 2, minutes = 3, set = ["train.lr=1"]}]']
        )


def test_refit_trains_the_chosen_epochs_on_train_and_valid() -> None:
    # beauty-bert4rec: a 30-minute budget whose decay runs by the clock; validation chose epoch 21
    cfg = load_config(RunConfig, "beauty-bert4rec")
    refit = refit_config(cfg, best_epoch=21)
    t = refit.train
    assert (t.train_on, t.max_epochs, t.decay, t.time_budget) == ("train+valid", 22, "epochs", None)
    assert t.decay_start == cfg.train.decay_start == 0.5  # the schedule's shape is kept
    # nothing else changes: the model, the task, the rest of the recipe
    changed = {line.split(":")[0] for line in config_diff(cfg, refit)}
    assert changed == {"train.train_on", "train.max_epochs", "train.decay", "train.time_budget"}
    # a constant rate stays constant; patience and a step limit would cut the chosen epochs
    sasrec = load_config(RunConfig, "beauty-sasrec", ["train.patience=3", "train.max_steps=500"])
    t = refit_config(sasrec, best_epoch=0).train
    assert (t.decay, t.max_epochs, t.patience, t.max_steps) == ("none", 1, 0, 0)


def test_refit_keeps_the_tiers_as_the_run_trained_them() -> None:
    cfg = load_config(RunConfig, "ml-1m-bert4rec", ["train.time_budget='15m'"])
    trained = apply_short_budget(cfg, lambda _: 93.48)  # as its config.json records it
    assert trained.bert4rec.dropout == 0.0  # under 120 epochs
    refit = refit_config(trained, best_epoch=74)
    assert refit.bert4rec.dropout == 0.0 and refit.bert4rec.max_len == 200
    assert refit.short_budget == () and refit.train.max_epochs == 75


def test_refit_needs_a_run_chosen_on_validation() -> None:
    cfg = load_config(RunConfig, "beauty-bert4rec")
    with pytest.raises(ConfigError, match="nothing chose its epochs on validation"):
        refit_config(refit_config(cfg, best_epoch=3), best_epoch=3)
    with pytest.raises(ConfigError, match="no chosen epoch"):
        refit_config(cfg, best_epoch=-1)


def test_a_recipe_fits_its_sizes_to_the_data_and_an_explicit_size_wins() -> None:
    import numpy as np

    from seqrec.training.policy import adapt_to_data

    cfg = load_config(RunConfig, "sasrec-ce")
    assert cfg.adapt == ("max_len", "batch_size", "loss")
    lengths = np.arange(1, 101)  # the 95th percentile: 1 + 0.95 * 99 = 95.05 -> 96 (8 | 96)
    fitted, said = adapt_to_data(cfg, lengths, n_items=20_000)
    assert (fitted.sasrec.max_len, fitted.train.batch_size, fitted.adapt) == (96, 128, ())
    assert said[0].startswith("sasrec.max_len 96")
    short = np.array([3] * 50)  # never below 16; never above the recipe's 200
    assert adapt_to_data(cfg, short, 100)[0].sasrec.max_len == 16
    assert adapt_to_data(cfg, np.array([900] * 5), 100)[0].sasrec.max_len == 200
    # a full softmax's batch halves per doubling of the catalogue beyond 20,000, down to 32
    ce = dataclasses.replace(cfg, adapt=("max_len", "batch_size"))  # the loss not fitted
    sizes = (20_000, 20_001, 40_000, 40_001)
    batches = [adapt_to_data(ce, lengths, n)[0].train.batch_size for n in sizes]
    assert batches == [128, 64, 64, 32]
    assert adapt_to_data(ce, lengths, 10**7)[0].train.batch_size == 32
    explicit = load_config(RunConfig, "sasrec-ce", ["sasrec.max_len=50"])
    assert explicit.adapt == ("batch_size", "loss")
    assert adapt_to_data(explicit, lengths, 100)[0].sasrec.max_len == 50
    # a run that fitted its sizes is the same config as the recipe that asked for them
    assert as_trained(cfg, like=fitted) == as_trained(fitted)
    assert as_trained(cfg, like=fitted).sasrec.max_len == 96


def test_a_sparse_log_trains_the_bert4rec_recipe_at_a_lower_rate() -> None:
    import numpy as np

    from seqrec.training.policy import adapt_to_data

    cfg = load_config(RunConfig, "bert4rec")
    assert cfg.adapt == ("max_len", "loss", "lr") and cfg.train.lr == 2e-3
    assert adapt_to_data(cfg, np.full(1000, 8), 29_000)[0].train.batch_size == 128  # not halved
    lengths = np.full(1000, 8)  # 8,000 training interactions
    # 8 an item (1,000 items): 2e-3 x sqrt(8 / 32) = 1e-3, and the run says why
    fitted, said = adapt_to_data(cfg, lengths, n_items=1000)
    assert fitted.train.lr == 1e-3
    assert any(s.startswith("train.lr 0.001 (8.0 training interactions an item") for s in said)
    # 289 an item (ML-1M's shape) and 32 keep the recipe's; one a item stops at a quarter
    assert adapt_to_data(cfg, np.full(1000, 289), 1000)[0].train.lr == 2e-3
    assert adapt_to_data(cfg, np.full(1000, 32), 1000)[0].train.lr == 2e-3
    assert adapt_to_data(cfg, np.full(1000, 1), 1000)[0].train.lr == 5e-4
    # an explicit rate wins; a run reused as it fitted its rate
    explicit = load_config(RunConfig, "bert4rec", ["train.lr=0.003"])
    assert "lr" not in explicit.adapt
    assert adapt_to_data(explicit, lengths, 1000)[0].train.lr == 3e-3
    assert as_trained(cfg, like=fitted).train.lr == 1e-3


def test_device_tiers_apply_on_their_device_first_and_explicit_keys_win() -> None:
    # the shipped BERT4Rec recipe on a GPU: a batch of 768, its learning rate, a minute
    cfg = load_config(RunConfig, "ml-1m-bert4rec")
    gpu = apply_device_tiers(cfg, "cuda")
    t = gpu.train
    assert (t.batch_size, t.lr, t.warmup_steps, t.time_budget) == (768, 0.004, 100, "60s")
    assert (cfg.bert4rec.dropout_impl, gpu.bert4rec.dropout_impl) == ("fast", "torch")
    assert (t.eval_every, t.checkpoint_every, t.prefetch, t.fused_adamw) == (20, 20, 4, True)
    assert [(x.device, x.applied, x.on) for x in gpu.short_budget][-1] == ("cuda", True, "cuda")
    # on a CPU nothing changes, and the tier records that it was decided there
    cpu = apply_device_tiers(cfg, "cpu")
    assert cpu.train == cfg.train
    assert [(x.applied, x.on) for x in cpu.short_budget][-1] == (False, "cpu")
    # decided once: a recorded config (a resumed run) is not decided again
    assert apply_device_tiers(cpu, "cuda") == cpu
    # a run of either is reused as it trained (the reuse check compares these)
    for done in (gpu, cpu):
        assert config_diff(as_trained(done), as_trained(cfg, like=done)) == []
    # an explicit key wins over the tier's; the tier's others still apply
    given = load_config(RunConfig, "ml-1m-bert4rec", ["train.time_budget='5m'"])
    t = apply_device_tiers(given, "cuda").train
    assert (t.time_budget, t.batch_size) == ("5m", 768)
    # the epochs tiers are timed on the config the device tier made
    bought: list[int] = []
    apply_short_budget(gpu, lambda c: bought.append(c.train.batch_size) or 500.0)
    assert bought == [768]


def test_device_tiers_are_checked() -> None:
    def tier(**fields: object) -> str:
        body = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
        return f"short_budget=[{{{body}}}]"

    with pytest.raises(
        ConfigError, match=r"^short_budget\.device: expected cpu or cuda, got 'tpu'"
    ):
        load_config(RunConfig, None, [tier(device="tpu", set=["train.lr=1"])])
    with pytest.raises(ConfigError, match=r"^short_budget: a tier is due by minutes, by epochs or"):
        load_config(RunConfig, None, [tier(device="cuda", minutes=3, set=["train.lr=1"])])
    with pytest.raises(ConfigError, match=r"^short_budget\.set: 'train\.device=\"cpu\"' cannot"):
        load_config(RunConfig, None, [tier(device="cuda", set=['train.device="cpu"'])])
    # a device tier may set the budget (the other tiers then read it); a budget's tier may not
    cfg = load_config(RunConfig, None, [tier(device="cpu", set=['train.time_budget="2m"'])])
    assert apply_device_tiers(cfg, "cpu").train.time_budget == "2m"
