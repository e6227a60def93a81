"""The co-partitioning contract checked when a consumer is planned: key types and how producers hashed.

Producers hash every key column of the integer family (``byte`` to ``long``, ``decimal(p,0)``) as a
``bigint`` and every other key column as its string form (``cast(k as string)``) before ``xxhash64``,
so an ``int`` 5, a ``bigint`` 5 and a ``decimal(12,0)`` 5 land in the same subpartition (Spark's own
``xxhash64`` hashes an int and a long of equal value differently), and no integer is formatted as text
on the way. What the casts cannot make equal is refused here, from the schema each producer recorded
in its manifest: key columns of different
families at the same position, decimals of different scales, floating-point keys (``-0.0`` and
``0.0`` are equal in a Spark join but print differently), strings with a non-binary collation (equal
under ``UTF8_LCASE`` but different bytes), and timestamp keys written under different session time
zones (their text differs for one instant).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_speculative.exceptions import PlanError

# Recorded in every hash-partitioned manifest (``partitioning.hash``) and in the plan's output, so a
# result hashed another way is never read as if it were co-partitioned with this one.
HASH_SCHEME = "xxhash64-integers-as-bigint-v2"
# Every key column as its string form: what plans without a ``hash`` and older plans ask of a writer.
STRING_HASH_SCHEME = "xxhash64-of-string-v1"

_INTEGRAL = {"byte", "short", "integer", "long"}
_STRING = {"string"}
_FLOATING = {"float", "double"}


def key_family(spark_type: Any) -> str | None:
    """The family a key column's Spark type hashes as (None: the null type, compatible with any)."""
    if isinstance(spark_type, dict):
        # Nested types: the same after integer widths are unified (their string form is then equal).
        text = json.dumps(spark_type, sort_keys=True)
        for name in ("byte", "short", "integer"):
            text = text.replace(f'"{name}"', '"long"')
        return f"{spark_type.get('type', 'complex')}:{text}"
    name = str(spark_type)
    if name in ("void", "null"):
        return None
    if name in _INTEGRAL:
        return "integer"
    if name in _STRING or name.startswith(("varchar(", "char(")):
        return "string"
    if name.startswith("decimal"):
        scale = name.rstrip(")").split(",")[-1].strip() if "," in name else "0"
        # decimal(p,0) prints like an integer: it hashes with them.
        return "integer" if scale == "0" else f"decimal(scale {scale})"
    if name in _FLOATING:
        return "floating"
    return name


def hashes_as_bigint(spark_type: Any, scheme: str | None) -> bool:
    """Whether a key column of ``spark_type`` (StructType JSON form) is cast to ``bigint`` before hashing.

    Under :data:`HASH_SCHEME` the integer family is; under any other scheme every column hashes as its
    string form. A ``decimal(p,0)`` outside the ``bigint`` range becomes null (``try_cast``): it can only
    equal another such decimal, which is null as well, so equal keys still meet.
    """
    return scheme == HASH_SCHEME and not isinstance(spark_type, dict) and key_family(spark_type) == "integer"


def exchange_output_problem(columns: Sequence[str], key: Sequence[str], reserved: str) -> str | None:
    """Why a keyed exchange output with ``columns`` cannot be written, or None.

    The key columns must be there, and no column may be named ``reserved``: the exchange writes each row's
    subpartition under that name (a directory or a column), which would replace the user's values unseen. Spark
    resolves column names without case by default, so any case of it is refused.
    """
    missing = [k for k in key if k not in columns]
    if missing:
        return f"the output lacks exchange key columns {missing} (columns: {list(columns)})"
    clash = [c for c in columns if c.lower() == reserved.lower()]
    if clash:
        return (f"the output has a column named {clash[0]!r}, which an exchange reserves for each row's "
                f"subpartition ({reserved!r}); rename it (columns: {list(columns)})")
    return None


def key_cast(spark_type: Any, scheme: str | None) -> tuple[str, bool]:
    """The type a key column of ``spark_type`` is cast to before hashing, and whether as ``try_cast``.

    ``bigint`` for what :func:`hashes_as_bigint` says, by ``try_cast`` for a ``decimal(p,0)`` (one outside
    the ``bigint`` range becomes null instead of failing the write); ``string`` for every other column.
    """
    if not hashes_as_bigint(spark_type, scheme):
        return "string", False
    return "bigint", str(spark_type).startswith("decimal")


def key_types(schema: Mapping[str, Any] | None, key: Sequence[str]) -> list[Any] | None:
    """The Spark types of ``key``'s columns in a StructType JSON, None for a column the schema lacks."""
    if not schema:
        return None
    by_name = {f["name"]: f.get("type") for f in schema.get("fields") or [] if isinstance(f, dict) and "name" in f}
    return [by_name.get(k) for k in key]


def _collation(schema: Mapping[str, Any], column: str) -> str | None:
    """The non-binary collation of ``column`` (or of a string nested in it) a StructType JSON records, if any."""
    for field in schema.get("fields") or []:
        if isinstance(field, dict) and field.get("name") == column:
            collations = (field.get("metadata") or {}).get("__COLLATIONS") or {}
            for name in collations.values() if isinstance(collations, dict) else ():
                if str(name).rsplit(".", 1)[-1].upper() != "UTF8_BINARY":
                    return str(name).rsplit(".", 1)[-1]
    return None


def _type_name(spark_type: Any) -> str:
    return spark_type.get("type", "complex") if isinstance(spark_type, dict) else str(spark_type)


def check_key_types(where: str, inputs: Mapping[str, tuple[Sequence[str], Sequence[Mapping[str, Any] | None]]]) -> None:
    """Refuse hash-partitioned inputs whose key columns cannot hash alike.

    ``inputs`` maps input name -> (its key columns, the schemas its producer subtasks committed). Every
    schema of every input is compared position by position; a missing schema (an empty or hybrid
    producer) is skipped. Cost O(inputs x producer subtasks x key columns).
    """
    seen: dict[int, tuple[str, str, str, str]] = {}  # position -> (family, input, column, type)
    for name, (key, schemas) in inputs.items():
        for schema in schemas:
            types = key_types(schema, key)
            if types is None or schema is None:
                continue
            for position, (column, spark_type) in enumerate(zip(key, types, strict=True)):
                if spark_type is None:
                    columns = [f.get("name") for f in schema.get("fields") or [] if isinstance(f, dict)]
                    raise PlanError(f"{where}, input {name!r}: key column {column!r} is not in the producer's "
                                    f"output (columns: {columns})")
                family = key_family(spark_type)
                collation = _collation(schema, column)
                if collation is not None:
                    raise PlanError(
                        f"{where}, input {name!r}: key column {column!r} has collation {collation}; the exchange "
                        f"hashes a string's exact bytes, so strings equal under {collation} would land in different "
                        f"subtasks. Partition on a binary-collated key (e.g. lower({column}) or "
                        f"collate({column}, 'UTF8_BINARY')) in the producer")
                if family == "floating":
                    raise PlanError(
                        f"{where}, input {name!r}: key column {column!r} is {_type_name(spark_type)}; floating-point "
                        f"keys are refused (-0.0 and 0.0, or a float and a double of one value, are equal to Spark "
                        f"but hash apart). Cast it to a decimal or an integer in the producer")
                if family is None:
                    continue
                if position not in seen:
                    seen[position] = (family, name, column, _type_name(spark_type))
                    continue
                first_family, first_input, first_column, first_type = seen[position]
                if family != first_family:
                    raise PlanError(
                        f"{where}: key column {position + 1} differs in type between inputs: {first_input!r}."
                        f"{first_column} is {first_type}, {name!r}.{column} is {_type_name(spark_type)}; equal "
                        f"values would not meet in one subtask. Cast one side in its producer (integer widths "
                        f"mix freely; decimals need the same scale)")


def check_partitioning(where: str, inputs: Mapping[str, tuple[int, Sequence[Mapping[str, Any] | None]]]) -> None:
    """Refuse producer results not hashed the way the plan expects.

    ``inputs`` maps input name -> (the subpartition count expected, the ``partitioning`` records its
    producer subtasks committed). A result committed before the records existed (None) is accepted
    alone but not next to a current one.
    """
    schemes: dict[str, str] = {}
    for name, (expected, records) in inputs.items():
        for record in records:
            scheme = (record or {}).get("hash") or "legacy"
            count = (record or {}).get("max_parallelism")
            if count is not None and int(count) != expected:
                raise PlanError(f"{where}, input {name!r}: its producer committed {count} hash subpartitions, the "
                                f"plan expects {expected}; rerun the producer")
            schemes.setdefault(scheme, name)
    if len(schemes) > 1:
        described = ", ".join(f"{scheme} ({name!r})" for scheme, name in schemes.items())
        raise PlanError(f"{where}: inputs were hash-partitioned by different schemes: {described}; rerun the "
                        f"producers with this provider version")


def check_time_zones(where: str, inputs: Mapping[str, tuple[Sequence[str],
                                                            Sequence[tuple[Mapping[str, Any] | None,
                                                                           Mapping[str, Any] | None]]]]) -> None:
    """Refuse timestamp keys that producers hashed under different session time zones.

    ``inputs`` maps input name -> (its key columns, (schema, partitioning record) per producer subtask).
    A timestamp hashes as its text, which depends on ``spark.sql.session.timeZone`` (a stage's
    ``spark_conf``, or each Spark server's default): one instant written in two zones would hash apart.
    Records without a zone (older results) are not compared. Cost O(inputs x producer subtasks x key columns).
    """
    zones: dict[str, tuple[str, str]] = {}  # zone -> (input, column)
    for name, (key, parts) in inputs.items():
        for schema, record in parts:
            zone = (record or {}).get("session_time_zone")
            types = key_types(schema, key)
            if zone is None or types is None:
                continue
            for column, spark_type in zip(key, types, strict=True):
                if spark_type == "timestamp":
                    zones.setdefault(str(zone), (name, column))
    if len(zones) > 1:
        described = ", ".join(f"{name!r}.{column} in {zone}" for zone, (name, column) in sorted(zones.items()))
        raise PlanError(f"{where}: timestamp key columns were hashed under different session time zones ({described}); "
                        f"one instant would land in different subtasks. Give the producers one "
                        f"spark.sql.session.timeZone (e.g. UTC in each stage's spark_conf), or partition on "
                        f"unix_micros(<column>)")


# One keyed input as the checks see it: (key columns, (schema, partitioning record) per producer subtask).
KeyedParts = tuple[Sequence[str], Sequence[tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]]


def hybrid_key_refusal(where: str, hybrid_input: str, upstream: str, inputs: Mapping[str, KeyedParts]) -> str | None:
    """Why a hybrid producer's first admitted output cannot be read with the consumer's other inputs, or None.

    A hybrid producer has committed nothing when its consumer is planned, so the plan-time checks
    (:func:`check_key_types`, :func:`check_time_zones`) run again when its first subtask is admitted,
    before any consumer attempt may read it. ``inputs`` maps every all_to_all input whose producer output
    is known to (key columns, (schema, partitioning record) per producer subtask known): blocking inputs
    with every committed subtask, hybrid ones with the subtask checked so far (``hybrid_input`` included).
    """
    try:
        check_key_types(where, {name: (key, [schema for schema, _ in parts]) for name, (key, parts) in inputs.items()})
        check_time_zones(where, inputs)
    except PlanError as exc:
        return (f"{exc} (input {hybrid_input!r} is a hybrid exchange: producer {upstream!r} was checked when its "
                f"first subtask was admitted, before any attempt of this stage read it)")
    return None
