//! The conformance suite on the in-memory backend.

fencelock::conformance_tests!(async { Some(fencelock::conformance::MemoryFactory::new()) });
