//! Connection settings of the etcd backend.

use std::time::Duration;

/// Settings for [`EtcdBackend::connect_with`](crate::EtcdBackend::connect_with).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The cluster's client endpoints (`host:port` or `http://host:port`).
    pub endpoints: Vec<String>,
    /// How long to wait for the cluster to answer when connecting (default 5 s).
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive ping interval on the connection (default 2 s).
    pub keep_alive_interval: Duration,
    /// How long a keep-alive ping may go unanswered before the connection is dropped
    /// (default 2 s).
    pub keep_alive_timeout: Duration,
    /// User and password, if the cluster has authentication enabled.
    pub user: Option<(String, String)>,
}

impl EtcdConfig {
    /// Default settings for `endpoints`.
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdConfig {
            endpoints,
            connect_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_secs(2),
            keep_alive_timeout: Duration::from_secs(2),
            user: None,
        }
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets user and password.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }
}
