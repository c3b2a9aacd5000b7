"""`make install` writes the class-data-sharing archives of every jar set the platform's commands start Spark with.

The install's training run is the one under test (running it again here would cost two Spark JVMs and their
dumps): the archives it leaves are this installation's, one per jar set, each a real archive. That a JVM maps
an archive written this way, and ignores one that does not match it, is test_class_archive.py's.
"""

from __future__ import annotations

import pytest

from deploy.runtime import class_archive
from deploy.runtime.class_archive_training import jar_sets
from deploy.settings import load_settings


def test_the_install_left_an_archive_for_each_jar_set_its_commands_start_spark_with() -> None:
    folder = load_settings().spark_class_archive_dir
    if folder is None:
        pytest.skip("class-data sharing is off (LAMBDA_SPARK_CLASS_ARCHIVE_DIR is empty)")
    archives = class_archive.installation_archives(folder)
    assert len(archives) >= len(jar_sets()), (
        f"{len(archives)} archive(s) of this installation in {folder} for {len(jar_sets())} jar sets "
        f"({', '.join(jar_sets())}): run `python -m deploy.runtime.class_archive_training` (make install does)")
    assert all(archive.stat().st_size > 10_000_000 for archive in archives), "each holds the driver's classes"
