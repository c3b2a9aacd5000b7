"""Spark on object storage: Hadoop's S3A connector, its jars and its configuration.

pyspark 4.2 bundles Hadoop 3.5.0 (``hadoop-client-api``/``-runtime``) but not ``hadoop-aws``, the
S3A connector; its Maven artifact of the same version is resolved with the Delta jar into the
shared Ivy cache, only when the tables are on ``s3://``. ``hadoop-aws`` depends on the AWS SDK v2
``bundle`` (686 MB, every AWS service, shaded): it is excluded, and the SDK modules S3A loads are
asked for one by one instead (``s3`` with its protocol, auth and HTTP client modules, and
``s3-transfer-manager``; found by running S3A against an S3 server until no class was missing).
What Spark's own jars provide (netty, Apache HttpClient, commons-codec) is excluded as well, so the
classpath holds one copy of each.

Credentials: S3A's default provider chain reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
(/ ``AWS_SESSION_TOKEN``) from the environment (where ``deploy`` puts the settings' credentials),
else a profile or an instance role: no secret is written into the Spark configuration. The endpoint
and region are not secret and go into it (``fs.s3a.endpoint``, ``fs.s3a.endpoint.region``).

Delta's LogStore on ``s3a://`` is ``S3SingleDriverLogStore`` (delta-spark's default for the
s3/s3a/s3n schemes): it makes a commit mutually exclusive only among the writers of ONE driver
(a JVM lock) and then writes the commit file with an overwriting put. Writers in two Spark
drivers, or a Spark driver and delta-rs, committing the same version at the same moment can
overwrite each other's commit (see the README, "Object storage").
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from batch_layer.master.object_store import ENDPOINT_VARIABLE, REGION_VARIABLE

HADOOP_VERSION = "3.5.0"  # pyspark 4.2's bundled Hadoop: hadoop-aws must match it exactly
AWS_SDK_VERSION = "2.35.4"  # the SDK hadoop-aws 3.5.0 is built against
#: The S3A connector and the AWS SDK v2 modules it loads (in place of the 686 MB ``bundle``).
S3A_PACKAGES = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
    f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
)
#: Left out of the resolution: the SDK bundle, and what pyspark's own jars already provide (newer).
S3A_EXCLUDES = (
    "software.amazon.awssdk:bundle",
    "software.amazon.awssdk:netty-nio-client",
    "io.netty:*",
    "org.apache.httpcomponents:*",
    "commons-codec:*",
)


def s3a_spark_conf() -> dict[str, str]:
    """Spark settings for ``s3a://`` tables: the connector's jars (to be merged into
    ``spark.jars.packages`` / ``spark.jars.excludes``) and its endpoint, region and addressing.

    An endpoint in ``AWS_ENDPOINT_URL`` (MinIO, moto...) gets path-style addressing and, for an
    ``http://`` URL, no TLS; without one S3A talks to AWS.
    """
    conf = {
        "spark.jars.packages": ",".join(S3A_PACKAGES),
        "spark.jars.excludes": ",".join(S3A_EXCLUDES),
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    }
    endpoint = os.environ.get(ENDPOINT_VARIABLE)
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(urlparse(endpoint).scheme == "https").lower()
    region = os.environ.get(REGION_VARIABLE)
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def merge_conf(base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """``base`` updated with ``extra``; comma lists (``spark.jars.packages``/``excludes``) are joined."""
    merged = dict(base)
    for key, value in extra.items():
        if key in ("spark.jars.packages", "spark.jars.excludes") and merged.get(key):
            merged[key] = f"{merged[key]},{value}"
        else:
            merged[key] = value
    return merged
