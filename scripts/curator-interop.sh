#!/usr/bin/env bash
# Interoperability with Apache Curator (Java): fencelock's ZooKeeper Mutex and Curator's
# InterProcessMutex contend on the same lock path, in both directions.
#
# What runs: the `curator::` tests of tests/tests/zookeeper.rs. They start a single-node
# ZooKeeper (Debian's `zookeeper` package) on a free loopback port, compile
# tests/java/CuratorMutex.java with javac into a temporary directory against the jars of
# Debian's `libcurator-recipes-java` (/usr/share/java), and run it in its own JVM:
#   1. Curator holds `/{ns}/{lock}` -> our lock() waits -> Curator releases -> we are granted.
#   2. we hold -> Curator's acquire(1 s) times out, a waiting acquire() blocks -> we release ->
#      Curator acquires (its czxid above our token).
# Without java/javac/the jars the tests print "skipped: ..." (with CI=true they fail).
# They also run as part of `scripts/test.sh` (the whole workspace) in CI.
#
# Needs: zookeeper, libcurator-recipes-java, a JDK (javac), e.g. on Debian:
#   sudo apt-get install zookeeper libcurator-recipes-java default-jdk-headless
#
# The Java program by hand, against any ZooKeeper (prints STARTED, ACQUIRED <czxid> <node>,
# holds until you press Enter, then RELEASED):
#   CP=/usr/share/java/curator-recipes.jar:/usr/share/java/curator-framework.jar:\
#   /usr/share/java/curator-client.jar:/usr/share/java/zookeeper.jar:\
#   /usr/share/java/zookeeper-jute.jar:/usr/share/java/guava.jar:/usr/share/java/slf4j-api.jar
#   javac -d /tmp/curator -cp "$CP" tests/java/CuratorMutex.java
#   java -cp "/tmp/curator:$CP" CuratorMutex 127.0.0.1:2181 /fencelock/jobs/reindex
# (fencelock's lock `jobs/reindex` in namespace `fencelock` is the path /fencelock/jobs/reindex.)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
[ -f /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi

cargo test -p fencelock-integration --test zookeeper_curator -- --nocapture "$@"
