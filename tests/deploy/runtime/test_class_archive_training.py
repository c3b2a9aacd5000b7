"""`make install` writes the class-data-sharing archive of every jar set the platform's commands start Spark with.

The install's training run is the one under test (running it again here would cost two Spark JVMs and their
dumps): the archive each jar set's drivers map (``deploy.runtime.spark.class_archive_path``, named as
``build_spark`` names it) is in place. That a JVM maps an archive written this way, and ignores one that does not
match it, is test_class_archive.py's.
"""

from __future__ import annotations

import pytest

from deploy.runtime.class_archive_training import jar_sets
from deploy.runtime.spark import class_archive_path
from deploy.settings import load_settings


def test_the_install_left_the_archive_of_each_jar_set_its_commands_start_spark_with() -> None:
    settings = load_settings()
    if settings.spark_class_archive_dir is None:
        pytest.skip("class-data sharing is off (LAMBDA_SPARK_CLASS_ARCHIVE_DIR is empty)")
    for name, packages in jar_sets().items():
        archive = class_archive_path(settings, packages)
        assert archive is not None and archive.is_file(), (
            f"no class-data-sharing archive for {name} ({archive}): `python -m deploy.runtime.class_archive_training` "
            "writes it (make install and make test do; another checkout's install may have evicted it)")
        assert archive.stat().st_size > 10_000_000, f"{archive} holds the driver's classes"
