"""Any CTR dataset by schema: an Avazu-shaped file (CSV, gzip, parquet) with the built-in
schema, a team's own headerless TSV by an inline or YAML schema, and files that do not match
their schema named by column and line."""

from __future__ import annotations

import gzip

import numpy as np
import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FeatureMap
from ctrcal.data.schema import AVAZU, AVAZU_CATEGORICAL, resolve_schema

ROWS = 3_000


def _avazu_frame(rows: int = ROWS, seed: int = 0) -> pl.DataFrame:
    """Avazu's train.csv columns: id, click, hour (YYMMDDHH, sorted), 21 categoricals spelled
    as Avazu spells them (8-hex ids, small integers)."""
    rng = np.random.default_rng(seed)
    hours = np.sort(rng.integers(0, 72, rows))  # three days, in time order
    cols: dict[str, object] = {
        "id": [str(x) for x in rng.integers(0, 2**63, rows, dtype=np.int64)],
        "click": (rng.random(rows) < 0.17).astype(np.int64),
        "hour": 14102100 + (hours // 24) * 100 + hours % 24,
    }
    for k, name in enumerate(AVAZU_CATEGORICAL):
        size = 4 + 40 * (k % 5)
        ranks = np.minimum(rng.zipf(1.3, rows), size) - 1
        if name.startswith("C") or name.endswith(("_pos", "_type")):
            cols[name] = 1000 + ranks  # integers
        else:
            cols[name] = [f"{(r * 2654435761 + k) % 2**32:08x}" for r in ranks]
    return pl.DataFrame(cols)


def _cfg(**data) -> Config:
    cfg = Config()
    cfg.data.schema = "avazu"
    cfg.data.split_order = "time"
    cfg.features.min_count = 2
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


@pytest.fixture(scope="module")
def avazu(tmp_path_factory):
    root = tmp_path_factory.mktemp("avazu")
    frame = _avazu_frame()
    csv = root / "train.csv"
    frame.write_csv(csv)
    parquet = root / "train.parquet"
    frame.write_parquet(parquet)
    gz = root / "train.csv.gz"
    gz.write_bytes(gzip.compress(csv.read_bytes()))
    return frame, csv, parquet, gz


def test_avazu_by_its_schema_split_by_hour(avazu, tmp_path):
    frame, csv, _, _ = avazu
    res = prepare([csv], tmp_path / "p", _cfg())
    fmap = FeatureMap.load(tmp_path / "p")
    assert fmap.categorical_fields == [*AVAZU_CATEGORICAL, "hour"]
    assert fmap.numeric_fields == [] and len(fmap.categorical_fields) == 22
    assert fmap.extra["schema"]["name"] == "avazu"
    first = fmap.extra["split"]["first_time"]
    hour = frame["hour"]
    assert res.rows == {
        "train": int((hour < first["valid"]).sum()),
        "valid": int(((hour >= first["valid"]) & (hour < first["test"])).sum()),
        "test": int((hour >= first["test"]).sum()),
    }
    assert abs(res.rows["train"] / ROWS - 0.8) < 0.05
    # hour of day as a feature: at most 24 values (+ the reserved ids)
    assert fmap.vocab_sizes[-1] <= 3 + 24
    train = pl.read_parquet(tmp_path / "p" / "train")
    assert train.columns == ["label", *AVAZU_CATEGORICAL, "hour"]
    assert train["label"].sum() == frame["click"][: res.rows["train"]].sum()


def test_string_ids_do_not_depend_on_polars_hash(avazu, tmp_path, monkeypatch):
    from ctrcal.data.identity import feature_identity
    from ctrcal.preparation.coder import string_keys
    from ctrcal.serving.encoding import RawRowEncoder

    frame, csv, _, _ = avazu
    prepare([csv], tmp_path / "a", _cfg())
    rows = frame.head(200).with_columns(pl.all().cast(pl.Utf8)).to_dicts()
    before = RawRowEncoder(tmp_path / "a").encode(rows)[0]

    # a polars whose string hash differs (as a new version's may) changes no id
    def other(self, *args, **kwargs):
        return self.cast(pl.Utf8).str.len_bytes().cast(pl.UInt64)

    monkeypatch.setattr(pl.Expr, "hash", other)
    monkeypatch.setattr(pl.Series, "hash", other)
    prepare([csv], tmp_path / "b", _cfg())
    assert feature_identity(tmp_path / "a") == feature_identity(tmp_path / "b")
    for split in ("train", "valid", "test"):
        a, b = (pl.read_parquet(tmp_path / d / split) for d in "ab")
        assert a.equals(b), split
    assert np.array_equal(RawRowEncoder(tmp_path / "b").encode(rows)[0], before)
    # the vocabulary holds each value's XXH64 key
    vocab = pl.read_parquet(tmp_path / "b" / "vocab.parquet").filter(pl.col("field") == "site_id")
    texts = frame["site_id"].unique().to_list()
    assert set(vocab["value"].to_list()) <= {int(k) for k in string_keys(texts)}


def test_a_directory_keyed_by_another_string_hash_is_refused_in_one_line(avazu, tmp_path):
    import json

    from ctrcal.data.feature_map import FEATURE_MAP_FILE
    from ctrcal.preparation.features import FeaturePipeline
    from ctrcal.serving.encoding import RawRowEncoder

    _, csv, _, _ = avazu
    out = tmp_path / "p"
    prepare([csv], out, _cfg())
    saved = json.loads((out / FEATURE_MAP_FILE).read_text())
    assert saved["string_hash"] == "xxh64" and "string_keys" not in saved
    FeaturePipeline.load(out)  # the same function: loads
    # what the previous release wrote (polars' hash and its probe), what no record means (a
    # release before the probe), and a name this code does not know
    old = {k: v for k, v in saved.items() if k != "string_hash"}
    cases = {
        "keyed by polars' string hash": {
            **old,
            "string_keys": {"probe": "0123456789abcdef", "polars": "1.31.0"},
        },
        "keyed by polars": old,
        "keyed by 'fnv1a64'": {**saved, "string_hash": "fnv1a64"},
    }
    for said, fm in cases.items():
        (out / FEATURE_MAP_FILE).write_text(json.dumps(fm))
        for load in (FeaturePipeline.load, RawRowEncoder):
            with pytest.raises(DataError) as caught:
                load(out)
            message = str(caught.value)
            assert "\n" not in message and said in message, message
            assert message.startswith(f"{out / FEATURE_MAP_FILE}: ")
            assert message.endswith("(it keys them with xxh64): re-run prepare")


def test_prepare_again_replaces_a_directory_keyed_by_another_string_hash(
    avazu, tmp_path, monkeypatch
):
    import ctrcal.preparation.prepare as preparing
    from ctrcal.preparation.features import FeaturePipeline

    _, csv, _, _ = avazu
    out = tmp_path / "p"
    assert not prepare([csv], out, _cfg()).reused
    assert prepare([csv], out, _cfg()).reused
    # what a release keying strings with another function prepared from the same file
    monkeypatch.setattr(preparing, "STRING_HASH", "fnv1a64")
    assert not prepare([csv], out, _cfg()).reused
    with pytest.raises(DataError, match="re-run prepare"):
        FeaturePipeline.load(out)
    monkeypatch.undo()
    assert not prepare([csv], out, _cfg()).reused  # the same command: prepared afresh
    FeaturePipeline.load(out)


def test_raw_rows_of_a_string_schema_encode_as_prepare_encoded_them(avazu, tmp_path):
    from ctrcal.core.ids import MISSING_ID
    from ctrcal.serving.encoding import RawRowEncoder

    frame, csv, _, _ = avazu
    res = prepare([csv], tmp_path / "p", _cfg())
    n = min(500, res.rows["train"])  # split by time: the first rows are train's
    train = pl.read_parquet(tmp_path / "p" / "train").head(n)
    encoder = RawRowEncoder(tmp_path / "p")
    rows = frame.head(n).with_columns(pl.all().cast(pl.Utf8)).to_dicts()
    cat, _ = encoder.encode(rows)
    assert np.array_equal(cat, train.drop("label").to_numpy())  # 64-bit string keys, whole
    # an empty value is missing, as prepare reads an empty field; blanks are a string value
    first = AVAZU_CATEGORICAL[0]
    cat, _ = encoder.encode([{**rows[0], first: ""}, {**rows[0], first: "  "}])
    assert cat[0, 0] == MISSING_ID and cat[1, 0] != MISSING_ID


def test_parquet_and_gzip_give_the_csv_result(avazu, tmp_path):
    _, csv, parquet, gz = avazu
    cfg = _cfg(split_order="random")
    prepare([csv], tmp_path / "csv", cfg)
    for other in (parquet, gz):
        prepare([other], tmp_path / other.suffix, cfg)
        a, b = FeatureMap.load(tmp_path / "csv"), FeatureMap.load(tmp_path / other.suffix)
        assert a.vocab_sizes == b.vocab_sizes
        for split in ("train", "valid", "test"):
            x = pl.read_parquet(tmp_path / "csv" / split)
            assert x.equals(pl.read_parquet(tmp_path / other.suffix / split)), (other, split)
    assert "parquet" in FeatureMap.load(tmp_path / ".parquet").layout


def test_a_file_that_does_not_match_its_schema(avazu, tmp_path):
    frame, _, _, _ = avazu
    no_site = tmp_path / "no_site.csv"
    frame.drop("site_id").write_csv(no_site)
    with pytest.raises(DataError, match=rf"{no_site}: line 1 \(header\): no column 'site_id'"):
        prepare([no_site], tmp_path / "p", _cfg())
    bad = tmp_path / "bad.csv"
    lines = _avazu_frame(50).write_csv().splitlines()
    fields = lines[6].split(",")
    fields[1] = "x"
    lines[6] = ",".join(fields)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 7: malformed row: click is not 0 or 1 \(got 'x'\)"):
        prepare([bad], tmp_path / "q", _cfg(split_order="random"))
    res = prepare([bad], tmp_path / "r", _cfg(split_order="random", on_bad_row="skip"))
    assert res.bad_rows == 1 and res.total_rows == 49


def _team_tsv(path, rows=400, seed=1):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        a = "" if rng.random() < 0.1 else f"{rng.normal(3, 2):.3f}"
        lines.append(
            "\t".join(
                [
                    str(int(rng.random() < 0.3)),
                    a,
                    f"user{rng.integers(30)}",
                    f"ad {rng.integers(8)}",
                ]
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


TEAM = {
    "name": "team",
    "label": "y",
    "numeric": ["a"],
    "categorical": ["u", "v"],
    "delimiter": "\t",
    "header": False,
    "columns": ["y", "a", "u", "v"],
}


def test_a_teams_own_tsv_by_an_inline_or_yaml_schema(tmp_path):
    import yaml

    data = _team_tsv(tmp_path / "logs.tsv")
    cfg = Config()
    cfg.data.schema = dict(TEAM)
    cfg.features.min_count = 1
    res = prepare([data], tmp_path / "inline", cfg)
    fmap = FeatureMap.load(tmp_path / "inline")
    assert fmap.numeric_fields == ["a"] and fmap.categorical_fields == ["u", "v"]
    assert fmap.vocab_sizes == [3 + 30, 3 + 8] and res.total_rows == 400
    assert 0.05 < fmap.numeric_missing_rate[0] < 0.15
    schema_file = tmp_path / "team.yaml"
    schema_file.write_text(yaml.safe_dump(TEAM))
    cfg.data.schema = str(schema_file)
    prepare([data], tmp_path / "file", cfg)
    assert pl.read_parquet(tmp_path / "file" / "train").equals(
        pl.read_parquet(tmp_path / "inline" / "train")
    )
    wide = tmp_path / "wide.tsv"
    wide.write_text("1\t2\tx\ty\tz\n")
    with pytest.raises(DataError, match=rf"{wide}: line 1: 5 fields .* expects 4"):
        prepare([wide], tmp_path / "w", cfg)


def test_an_empty_field_is_missing_quoted_or_not(tmp_path):
    spec = {"label": "y", "numeric": ["a"], "categorical": ["h"], "categorical_spelling": "hex"}
    rows = ["1,1.5,0a", "0,,0b", '1,"",0a', '0,"",""', '1,2,""', "0,3,0b"]
    data = tmp_path / "quoted.csv"
    data.write_text("\n".join(["y,a,h", *rows * 50]) + "\n")
    cfg = Config()
    cfg.data.schema = spec
    cfg.features.min_count = 1
    res = prepare([data], tmp_path / "p", cfg)
    assert res.bad_rows == 0 and res.total_rows == 300
    fmap = FeatureMap.load(tmp_path / "p")
    assert fmap.numeric_missing_rate[0] == pytest.approx(3 / 6, abs=0.1)  # ,, "" ""
    # a value that is there but not a number is still malformed
    (tmp_path / "bad.csv").write_text("y,a,h\n1,x,0a\n")
    with pytest.raises(DataError, match=r"line 2: malformed row: a is not a number \(got 'x'\)"):
        prepare([tmp_path / "bad.csv"], tmp_path / "q", cfg)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"label": "y", "categorical": ["u"], "colour": 1}, "unknown schema key"),
        ({"categorical": ["u"]}, "needs a 'label'"),
        ({"label": "y"}, "no numeric or categorical"),
        ({"label": "y", "categorical": ["u", "u"]}, "named twice"),
        ({"label": "y", "categorical": ["u"], "categorical_spelling": "base64"}, "spelling"),
        ("nope", "unknown schema 'nope'"),
    ],
)
def test_bad_schemas_are_refused(spec, match):
    with pytest.raises(DataError, match=match):
        resolve_schema(spec)


def test_builtins():
    assert resolve_schema("Avazu") is AVAZU
    assert AVAZU.time == "hour" and len(AVAZU.categorical) == 21 and AVAZU.label == "click"


def test_validate_names_a_bad_schema(tmp_path):
    from ctrcal.core.errors import ConfigError
    from ctrcal.validate import load_config

    path = tmp_path / "cfg.yaml"
    path.write_text("data:\n  schema: {label: y, categorical: [u], colour: red}\n")
    with pytest.raises(ConfigError, match=r"data\.schema.*unknown schema key.*colour"):
        load_config(path)
    path.write_text("data:\n  schema: avazu\n")
    assert resolve_schema(load_config(path).data.schema) is AVAZU


def test_validate_data_refuses_a_shift_the_data_cannot_take(avazu, tmp_path, capsys):
    """Gaussian noise on a dataset without numerics is a clear error from validate --data,
    whether the report evaluates under it or training injects it; corruption applies."""
    from ctrcal.cli import main

    _, csv, _, _ = avazu
    prepare([csv], tmp_path / "p", _cfg())
    base = "data:\n  schema: avazu\n  split_order: time\n"
    report = tmp_path / "report.yaml"
    report.write_text(base + "report:\n  shifts:\n    - {name: gaussian_numeric, space: model}\n")
    assert main(["validate", str(report)]) == 0  # without data nothing says it cannot apply
    assert main(["validate", str(report), "--data", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err
    assert "report.shifts[0]" in err and "gaussian_numeric" in err and "numeric" in err
    assert len(err.strip().splitlines()) == 1

    noisy = tmp_path / "noisy.yaml"
    noisy.write_text(
        base + "train:\n  train_shift: {name: gaussian_numeric, intensity: 0.25}\n"
        "report:\n  shifts:\n    - {name: categorical_corruption}\n"
    )
    assert main(["validate", str(noisy), "--data", str(tmp_path / "p")]) != 0
    assert "train.train_shift" in capsys.readouterr().err
    fine = tmp_path / "fine.yaml"
    fine.write_text(base + "report:\n  shifts:\n    - {name: categorical_corruption}\n")
    assert main(["validate", str(fine), "--data", str(tmp_path / "p")]) == 0
