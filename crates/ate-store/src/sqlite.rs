//! [`SqliteStore`]: the embedded default, one database file in WAL mode.
//!
//! Every multi-statement write runs in a `BEGIN IMMEDIATE` transaction, which takes SQLite's write
//! lock up front: concurrent writers wait for each other (up to the busy timeout) instead of failing
//! when a read lock cannot be upgraded. That also makes capacity admission and compare-and-set
//! serializable without row locks.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

type Db = sqlx::Sqlite;
type DbRow = sqlx::sqlite::SqliteRow;
type Tx = sqlx::Transaction<'static, Db>;
type StoreImpl = SqliteStore;

/// How long a writer waits for another writer's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections of a file-backed store (WAL lets readers run beside the one writer).
const MAX_CONNECTIONS: u32 = 8;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

macro_rules! for_update {
    () => {
        ""
    };
}

macro_rules! for_share {
    () => {
        ""
    };
}

/// The SQLite implementation of [`crate::Store`].
pub struct SqliteStore {
    pool: SqlitePool,
    counters: StoreCounters,
}

impl SqliteStore {
    /// Opens (creating the file and its directory if missing) and migrates the database at `url`:
    /// `sqlite:/path/state.db`, `sqlite:///abs/path`, `sqlite://relative/path`, or an in-memory
    /// `sqlite::memory:` (one connection, gone when the store is dropped; for tests).
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let memory = url.contains(":memory:") || url.contains("mode=memory");
        let pool = if memory {
            // Keep the single connection open forever: the database lives in it.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(options)
                .await?
        } else {
            if let Some(dir) = options
                .get_filename()
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Database(format!(
                        "creating directory {} for the store: {e}",
                        dir.display()
                    ))
                })?;
            }
            let options = options
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
            SqlitePoolOptions::new()
                .max_connections(MAX_CONNECTIONS)
                .connect_with(options)
                .await?
        };
        MIGRATOR.run(&pool).await?;
        Ok(Self {
            pool,
            counters: StoreCounters::default(),
        })
    }

    /// A write transaction that holds the database's write lock from its first statement.
    async fn begin_write(&self) -> Result<Tx> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Closes the pool (waits for connections to be returned).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

// Brings the shared `Store` impl and its imports (`Result`, `StoreCounters`, `StoreError`, …).
include!("shared_impl.rs");
