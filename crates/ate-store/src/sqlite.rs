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

use crate::{Result, StoreCounters, StoreError};

type Db = sqlx::Sqlite;
type DbRow = sqlx::sqlite::SqliteRow;
type Tx = WriteTx;
type StoreImpl = SqliteStore;

/// A write transaction that also holds the store's in-process writer lock until it commits or
/// is dropped. SQLite allows one writer; a second `BEGIN IMMEDIATE` waits in SQLite's busy
/// handler, which *sleeps* (1, 2, 5, 10 … 100 ms) instead of waking when the lock is free, so 16
/// concurrent resumes (~4 short write transactions each) queued for tens of milliseconds behind
/// transactions that held the lock for well under one. Writers of this process queue on a tokio
/// mutex instead and start the moment the previous one commits; the busy timeout still covers
/// other processes (the CLI's direct tools, a second api by mistake).
pub(crate) struct WriteTx {
    tx: sqlx::Transaction<'static, Db>,
    _writer: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteTx {
    async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl std::ops::Deref for WriteTx {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

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

/// No row locks on SQLite: `BEGIN IMMEDIATE` already makes a claim the only writer.
macro_rules! for_update_skip_locked {
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
    /// One writer at a time in this process (see [`WriteTx`]).
    writer: std::sync::Arc<tokio::sync::Mutex<()>>,
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
                // A connection to a local file does not go stale: the default ping before every
                // acquire was one more hop to the connection's thread per statement.
                .test_before_acquire(false)
                .connect_with(options)
                .await?
        };
        MIGRATOR.run(&pool).await?;
        Ok(Self {
            pool,
            counters: StoreCounters::default(),
            writer: std::sync::Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// A write transaction that holds the database's write lock from its first statement (and
    /// this process's writer lock until it ends).
    async fn begin_write(&self) -> Result<Tx> {
        let writer = self.writer.clone().lock_owned().await;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx {
            tx,
            _writer: writer,
        })
    }

    /// The writer lock for a one-statement write outside [`Self::begin_write`] (leases).
    async fn write_guard(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Some(self.writer.clone().lock_owned().await)
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
