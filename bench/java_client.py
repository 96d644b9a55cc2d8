"""The Java client program in ``tests/java`` (Apache Pulsar's Java client from Maven Central):
built once, its class path for ``java -cp``. Used by ``bench.retry_precision`` (Java's
``reconsumeLater`` timed beside nacktracker's) and ``tests/brokers/test_java_interop.py``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

JAVA_DIR = Path(__file__).resolve().parents[1] / "tests" / "java"


def java_classpath() -> str:
    """Build the program with Maven when its jar is missing or older than its sources
    (``mvn package dependency:build-classpath``, up to 15 min on a cold Maven cache);
    its jar plus its dependencies, joined for ``java -cp``."""
    target = JAVA_DIR / "target"
    jar, cp = target / "retry-interop-1.jar", target / "classpath.txt"
    sources = [JAVA_DIR / "pom.xml", *sorted((JAVA_DIR / "src").rglob("*.java"))]
    if not (jar.exists() and cp.exists() and jar.stat().st_mtime >= max(p.stat().st_mtime for p in sources)):
        subprocess.run(["mvn", "-q", "-B", "package", "dependency:build-classpath"], cwd=JAVA_DIR, check=True,
                       timeout=900)
    return f"{jar}{os.pathsep}{cp.read_text().strip()}"
