//! `ate keys`: the snapshot keys of a state directory (docs/security.md, "Snapshots at rest").

use std::path::PathBuf;

use anyhow::Context;

#[derive(Debug, clap::Subcommand)]
pub enum KeysCmd {
    /// Create STATE_DIR/keys (a key-encryption key file, 0600, and a data key wrapped by it)
    /// unless it exists; `ate up` does this at every start.
    Init(KeysArgs),
    /// A new key-encryption key: the data key is re-wrapped under it and the old KEK file is
    /// removed. Nothing stored is re-encrypted (the data key stays), running nodes keep
    /// working; copy the keys directory to the other nodes afterwards.
    Rotate(KeysArgs),
    /// Which data key and KEK the keys directory holds.
    Show(KeysArgs),
}

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// The state directory (keys are in STATE_DIR/keys).
    #[arg(long, env = "ATE_STATE_DIR", default_value = crate::client::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The keys directory itself, instead of STATE_DIR/keys.
    #[arg(long)]
    pub keys_dir: Option<PathBuf>,
}

impl KeysArgs {
    fn dir(&self) -> PathBuf {
        self.keys_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("keys"))
    }
}

fn kek_files(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with("kek-") && name.ends_with(".key") {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

pub fn run(cmd: KeysCmd) -> anyhow::Result<()> {
    match cmd {
        KeysCmd::Init(a) => {
            let dir = a.dir();
            let keys = ate_snapshot::SnapshotKeys::init(&dir)
                .with_context(|| format!("snapshot keys in {}", dir.display()))?;
            println!("keys {}: data key {}", dir.display(), keys.data_key_id());
        }
        KeysCmd::Rotate(a) => {
            let dir = a.dir();
            let r = ate_snapshot::rotate_keys(&dir)
                .with_context(|| format!("rotate the snapshot keys in {}", dir.display()))?;
            println!(
                "rotated: data key {} re-wrapped from {} to {} (old KEK file removed)",
                r.data_key, r.old_kek, r.new_kek
            );
        }
        KeysCmd::Show(a) => {
            let dir = a.dir();
            let keys = ate_snapshot::SnapshotKeys::load(&dir)
                .with_context(|| format!("snapshot keys in {}", dir.display()))?;
            println!(
                "keys {}: data key {}, KEK files {}",
                dir.display(),
                keys.data_key_id(),
                kek_files(&dir)?.join(", ")
            );
        }
    }
    Ok(())
}
