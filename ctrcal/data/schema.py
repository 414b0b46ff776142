"""Any CTR dataset by schema: which columns are the label, the numerics, the categoricals.

A :class:`DatasetSchema` names a file's label column, its numeric and categorical fields, an
optional time column (for time-ordered splits, and optionally a feature too), the delimiter and
header of its text form, and how its categoricals are spelled (``hex``: hashes read base 16,
as Criteo writes them; ``string``: any text, keyed by a 64-bit hash of the string). Criteo's
layouts are built-in instances (:data:`CRITEO`; the dac / Kaggle / BARS / torchrec variants
are detected from the file, see :mod:`ctrcal.preparation.criteo`); Avazu (Kaggle ``train.csv``) is
:data:`AVAZU`. A config's ``data.schema`` names a built-in, a YAML file, or holds the schema
inline::

    data:
      schema:
        label: clicked
        numeric: [price, age]
        categorical: [user, ad, site]
        time: ts                      # optional: time-ordered splits by this column
        delimiter: ","                # text input only; parquet needs none
        header: true
        categorical_spelling: string  # or hex

Input files may be CSV / TSV (plain or gzip) or parquet, read without a text round trip.
Columns the schema does not name are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.core.registry import Registry

SPELLINGS = ("hex", "string")
TIME_FEATURES = ("none", "value", "hour_of_day")


@dataclass(frozen=True)
class DatasetSchema:
    """The columns of one CTR dataset.

    Attributes:
        name: what messages and the feature map call it.
        label: the 0/1 click column.
        numeric: numeric fields (any real number; missing = empty).
        categorical: categorical fields.
        time: a column giving each row's time as an integer (e.g. Avazu's ``hour``,
            ``YYMMDDHH``): ``data.split_order: time`` cuts the splits by its value.
        time_feature: ``none``; ``value`` (the time column is also a categorical field);
            ``hour_of_day`` (its last two digits are, as BARS uses Avazu's ``hour``).
        delimiter: the field separator of the text form.
        header: whether the text form starts with a line of column names (without one, the
            file's columns are ``columns``).
        columns: every column of a headerless file, in order (ignored ones included).
        categorical_spelling: ``hex`` or ``string`` (see the module docstring).
    """

    name: str
    label: str
    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    time: str | None = None
    time_feature: str = "none"
    delimiter: str = ","
    header: bool = True
    columns: tuple[str, ...] = ()
    categorical_spelling: str = "string"

    def __post_init__(self) -> None:
        where = f"data.schema {self.name!r}"
        names = [self.label, *self.numeric, *self.categorical]
        if not self.numeric and not self.categorical:
            raise DataError(f"{where}: no numeric or categorical fields")
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise DataError(f"{where}: column {n!r} named twice")
            seen.add(n)
        if self.categorical_spelling not in SPELLINGS:
            raise DataError(
                f"{where}: categorical_spelling must be one of {', '.join(SPELLINGS)},"
                f" got {self.categorical_spelling!r}"
            )
        if self.time_feature not in TIME_FEATURES:
            raise DataError(
                f"{where}: time_feature must be one of {', '.join(TIME_FEATURES)}, "
                f"got {self.time_feature!r}"
            )
        if self.time_feature != "none" and self.time is None:
            raise DataError(f"{where}: time_feature {self.time_feature!r} needs a time column")
        if self.time is not None and self.time in names:
            raise DataError(
                f"{where}: the time column {self.time!r} is also a field; use "
                "time_feature to make it one"
            )
        if len(self.delimiter) != 1:
            raise DataError(f"{where}: delimiter must be one character, got {self.delimiter!r}")
        if not self.header:
            missing = [n for n in self.needed if n not in self.columns]
            if missing:
                raise DataError(
                    f"{where}: a file without a header needs 'columns' listing "
                    f"every column in order; missing {missing}"
                )

    @property
    def time_field(self) -> str | None:
        """The categorical field made from the time column, if any."""
        return None if self.time_feature == "none" else self.time

    @property
    def categorical_fields(self) -> tuple[str, ...]:
        """The categorical fields of the encoded data (the time feature last)."""
        extra = (self.time_field,) if self.time_field else ()
        return (*self.categorical, *extra)

    @property
    def needed(self) -> tuple[str, ...]:
        """The columns read from a file: label, numerics, categoricals, time."""
        return (self.label, *self.numeric, *self.categorical, *((self.time,) if self.time else ()))

    def needed_in(self, columns: tuple[str, ...]) -> tuple[str, ...]:
        """The :attr:`needed` columns a file with ``columns`` has (an unlabelled file lacks
        the label)."""
        return tuple(c for c in self.needed if c in columns)

    def to_dict(self) -> dict[str, Any]:
        """The schema as the feature map records it (and as YAML would spell it)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


CRITEO = DatasetSchema(
    name="criteo",
    label=LABEL,
    numeric=NUMERIC_COLUMNS,
    categorical=CATEGORICAL_COLUMNS,
    delimiter="\t",
    header=False,
    columns=(LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS),
    categorical_spelling="hex",
)
"""Criteo's dac / day_N layout (the other Criteo layouts are detected as variants of it)."""

AVAZU_CATEGORICAL = (
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
)
AVAZU = DatasetSchema(
    name="avazu",
    label="click",
    categorical=AVAZU_CATEGORICAL,
    time="hour",
    time_feature="hour_of_day",
    delimiter=",",
    header=True,
    categorical_spelling="string",
)
"""Avazu's Kaggle ``train.csv``: ``id`` ignored, label ``click``, 21 categoricals, ``hour``
(``YYMMDDHH``) the time column and, by its hour of day, a feature."""

SCHEMAS: Registry[DatasetSchema] = Registry("schema", error=DataError)
"""Dataset schemas by name: the built-ins and those added with :func:`register_schema`."""
SCHEMAS.register(CRITEO.name, CRITEO)
SCHEMAS.register(AVAZU.name, AVAZU)


def register_schema(schema: DatasetSchema) -> DatasetSchema:
    """Make ``schema`` available by its name to ``data.schema`` (replacing one of that name)."""
    return SCHEMAS.register(schema.name, schema, overwrite=True)


_KEYS = {f.name for f in fields(DatasetSchema)}


def schema_from_mapping(spec: Mapping[str, Any], source: str = "data.schema") -> DatasetSchema:
    """A schema from a YAML mapping (strict: an unknown key is an error naming it)."""
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise DataError(
            f"{source}: unknown schema key(s) {unknown} (valid: {', '.join(sorted(_KEYS))})"
        )
    if "label" not in spec:
        raise DataError(f"{source}: a schema needs a 'label' column")
    values = dict(spec)
    values.setdefault("name", Path(source).stem if source.endswith((".yaml", ".yml")) else "custom")
    for key in ("numeric", "categorical", "columns"):
        if key in values:
            v = values[key]
            if isinstance(v, str) or not all(isinstance(x, str) for x in v):
                raise DataError(f"{source}: {key} must be a list of column names, got {v!r}")
            values[key] = tuple(v)
    for key in ("label", "time", "delimiter", "name", "categorical_spelling", "time_feature"):
        if key in values and values[key] is not None and not isinstance(values[key], str):
            raise DataError(f"{source}: {key} must be a string, got {values[key]!r}")
    if "header" in values and not isinstance(values["header"], bool):
        raise DataError(f"{source}: header must be true or false, got {values['header']!r}")
    return DatasetSchema(**values)


def resolve_schema(
    spec: str | Mapping[str, Any] | DatasetSchema | None, base: Path | None = None
) -> DatasetSchema | None:
    """``data.schema`` -> a schema: None (Criteo, detected per file), a built-in name, a YAML
    file (relative to ``base``, the config's folder, if given) or an inline mapping."""
    if spec is None or isinstance(spec, DatasetSchema):
        return spec
    if isinstance(spec, Mapping):
        return schema_from_mapping(spec)
    name = str(spec)
    if name in SCHEMAS:
        return SCHEMAS.get(name)
    path = Path(name)
    if base is not None and not path.is_absolute() and not path.exists():
        path = base / path
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            spec = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise DataError(f"data.schema: {path}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise DataError(f"data.schema: {path}: not valid YAML: {exc}") from None
        if not isinstance(spec, Mapping):
            raise DataError(f"data.schema: {path}: expected a mapping of schema keys")
        return schema_from_mapping(spec, str(path))
    hint = SCHEMAS.suggest(name)
    did = f"; did you mean {hint!r}?" if hint else ""
    raise DataError(
        f"data.schema: unknown schema {name!r}{did} (built-in: {SCHEMAS.valid_names()}; "
        "or a .yaml file, or the schema inline)"
    )


__all__ = [
    "AVAZU",
    "CRITEO",
    "SCHEMAS",
    "DatasetSchema",
    "register_schema",
    "resolve_schema",
    "schema_from_mapping",
]
