//! The bench's own PostgreSQL cluster (`--private-postgres`), which the store faults stop.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio::process::Command;

use super::lab::{free_port, run_tool};

/// The PostgreSQL cluster of `--private-postgres`: `<state>/pg/data`, socket dir `<state>/pg`,
/// run as the `postgres` user.
pub(super) struct Pg {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    pub(super) running: bool,
}

impl Pg {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// initdb (trust auth) and the settings that keep it private: loopback, our port, the
    /// socket inside the cluster dir.
    pub(super) async fn create(bin: &Path, dir: PathBuf) -> anyhow::Result<Pg> {
        anyhow::ensure!(
            bin.join("initdb").exists(),
            "no initdb in {} (pass --pg-bin)",
            bin.display()
        );
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        run_tool(
            Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&dir),
            "chown",
        )
        .await?;
        let pg = Pg {
            bin: bin.to_path_buf(),
            dir,
            port: free_port()?,
            running: false,
        };
        pg.as_postgres(
            "initdb",
            &[
                "-D".into(),
                pg.data().display().to_string(),
                "-A".into(),
                "trust".into(),
                "-U".into(),
                "postgres".into(),
                "--no-sync".into(),
            ],
        )
        .await?;
        let conf = format!(
            "\n# ate bench faults\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n",
            pg.port,
            pg.dir.display()
        );
        let conf_path = pg.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path)
            .with_context(|| format!("cannot read {}", conf_path.display()))?;
        text.push_str(&conf);
        std::fs::write(&conf_path, text)
            .with_context(|| format!("cannot write {}", conf_path.display()))?;
        Ok(pg)
    }

    pub(super) async fn start(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("postgres.log").display().to_string();
        let data = self.data().display().to_string();
        self.as_postgres(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-w", "-t", "60", "start"].map(String::from),
        )
        .await?;
        self.running = true;
        Ok(())
    }

    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        let data = self.data().display().to_string();
        self.as_postgres(
            "pg_ctl",
            &["-D", &data, "-m", "fast", "-w", "-t", "60", "stop"].map(String::from),
        )
        .await?;
        self.running = false;
        Ok(())
    }

    /// `runuser -u postgres -- BIN/tool ARGS` in the cluster dir (postgres cannot read ours).
    async fn as_postgres(&self, tool: &str, args: &[String]) -> anyhow::Result<()> {
        run_tool(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join(tool))
                .args(args)
                .current_dir(&self.dir),
            tool,
        )
        .await
    }
}
