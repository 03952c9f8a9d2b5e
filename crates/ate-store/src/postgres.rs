//! [`PostgresStore`]: the production store.
//!
//! Transactions run at READ COMMITTED and take row locks where a decision depends on rows another
//! transaction may change: capacity admission locks the worker row (`FOR UPDATE`) before summing
//! its assignments, so concurrent binds to one worker queue up and never overbook; state
//! compare-and-set locks the actor row; creating an actor, template or tag locks the atespace (and
//! template) row `FOR SHARE` so a concurrent delete cannot slip in between check and insert.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::{Result, StoreCounters};

type Db = sqlx::Postgres;
type DbRow = sqlx::postgres::PgRow;
type Tx = sqlx::Transaction<'static, Db>;
type StoreImpl = PostgresStore;

/// Enough for the warm path to run many reads in parallel on a 2-core machine while staying well
/// under PostgreSQL's default limit of 100 connections with a few api replicas.
const MAX_CONNECTIONS: u32 = 24;
/// A caller waits at most this long for a connection (a server that is down is retried meanwhile):
/// the router gives a routing decision 10 s, and a lost store must turn into Unavailable soon.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

macro_rules! for_update {
    () => {
        " FOR UPDATE"
    };
}

/// Claims (alarms): rows another transaction holds are left to it instead of waited for, so
/// concurrent claimers take disjoint rows.
macro_rules! for_update_skip_locked {
    () => {
        " FOR UPDATE SKIP LOCKED"
    };
}

macro_rules! for_share {
    () => {
        " FOR SHARE"
    };
}

/// The PostgreSQL implementation of [`crate::Store`].
pub struct PostgresStore {
    pool: PgPool,
    counters: StoreCounters,
}

impl PostgresStore {
    /// Connects to `postgres://…` / `postgresql://…` and applies the migrations (in the first schema
    /// of the connection's `search_path`; pass `?options=-c%20search_path%3Dmy_schema` to pick one).
    pub async fn connect(url: &str) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self {
            pool,
            counters: StoreCounters::default(),
        })
    }

    async fn begin_write(&self) -> Result<Tx> {
        Ok(self.pool.begin().await?)
    }

    /// PostgreSQL serializes with row locks; nothing to hold in process.
    async fn write_guard(&self) -> Option<()> {
        None
    }

    /// Closes the pool (waits for connections to be returned).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

// The shared `Store` impl, compiled against this backend's `Db`, `DbRow`, `Tx`, `StoreImpl` and
// `for_update!` / `for_update_skip_locked!` / `for_share!` (defined above, so in scope there).
#[path = "shared/mod.rs"]
#[allow(clippy::duplicate_mod)] // by design: the other backend compiles it too, with its items
mod shared;
