//! The connection every request goes through: to one server (re-established after a failure),
//! or to a Redis Cluster (routed by key, following `MOVED` and `ASK`).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to the Redis deployment a [`RedisBackend`](crate::RedisBackend) uses: one
/// server (or the primary of the moment behind Sentinel), or a Redis Cluster, whose requests
/// go to the node that serves their first key. Cheap to clone; use it with `redis` commands
/// like any connection (`query_async(&mut con)`).
#[derive(Clone)]
pub struct RedisConnection(pub(crate) Inner);

#[derive(Clone)]
pub(crate) enum Inner {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConnection {
    pub(crate) fn server(con: ConnectionManager) -> Self {
        RedisConnection(Inner::Server(con))
    }

    pub(crate) fn cluster(con: ClusterConnection) -> Self {
        RedisConnection(Inner::Cluster(con))
    }
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Server(_) => "RedisConnection(server)",
            Inner::Cluster(_) => "RedisConnection(cluster)",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Server(c) => c.req_packed_command(cmd),
            Inner::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Inner::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Server(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}
