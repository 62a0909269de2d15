"""A local SparkSession set up to be quiet, offline and reliable on small machines: what each
setting is for is in docs/ANALYTICS.md, "The local session".

`local_session()` is for the nightly job run on one machine and for tests; on a cluster,
spark-submit makes the session and `analytics/nightly.py` only registers the data source.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

JAVA17_HOMES = ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-17-openjdk-arm64", "/usr/lib/jvm/openjdk-17")
_LOG4J = Path(__file__).with_name("log4j2.properties")


def java17_home() -> str | None:
    """JAVA_HOME if it is set, else a Java 17 found in the usual places (a machine may hold
    several JDKs, and PySpark 4.3 is tested here on 17)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    for home in JAVA17_HOMES:
        if Path(home, "bin", "java").exists():
            return home
    return None


def prepare_environment() -> None:
    """Environment the JVM and the Python workers must see before the session starts."""
    home = java17_home()
    if home:
        os.environ["JAVA_HOME"] = home
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_LOCAL_HOSTNAME", "localhost")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("TZ", "UTC")


def local_session(app_name: str = "eventlog", *, master: str = "local[2]", memory: str = "1g", short_lived: bool = False):
    """A quiet local session: UI off, UTC everywhere, small shuffles, the eventlog source registered."""
    prepare_environment()
    from pyspark.sql import SparkSession

    java_options = "-Duser.timezone=UTC -XX:+UseSerialGC"
    if short_lived:
        java_options += " -XX:TieredStopAtLevel=1"  # C1 only: faster for short runs such as tests
    if _LOG4J.exists():
        java_options += f" -Dlog4j2.configurationFile=file:{_LOG4J}"
    cores = master.removeprefix("local[").removesuffix("]") if master.startswith("local[") else "2"
    spark = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", cores if cores != "*" else "2")
        .config("spark.default.parallelism", cores if cores != "*" else "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", memory)
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from . import register

    register(spark)
    return spark
