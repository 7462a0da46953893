//! The conformance suite and the backend contract against a real ZooKeeper server (Debian's
//! `zookeeper` package; skipped with a message when it is missing, a failure in CI).

use fencelock_integration::servers::zookeeper::ZkFactory;

fencelock::conformance_tests!(ZkFactory::shared());
