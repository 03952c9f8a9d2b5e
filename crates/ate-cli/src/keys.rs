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
    /// A new key for actors' identity tokens (STATE_DIR/identity/identity-key.pem, the api's
    /// `--identity-key`; created if there is none): the old one becomes
    /// `identity-key.pem.previous` and stays in the JWKS, so tokens it signed verify until they
    /// expire (at most an hour). Restart the api to sign with the new key; rotate again only
    /// after an hour.
    RotateIdentity(IdentityKeyArgs),
}

#[derive(Debug, clap::Args)]
pub struct IdentityKeyArgs {
    /// The state directory (the key is STATE_DIR/identity/identity-key.pem).
    #[arg(long, env = "ATE_STATE_DIR", default_value = crate::client::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The key file itself (the api's `--identity-key`).
    #[arg(long)]
    pub key: Option<PathBuf>,
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
        KeysCmd::RotateIdentity(a) => {
            let path = a
                .key
                .unwrap_or_else(|| crate::up::identity_key_in(&a.state_dir));
            ate_api::jwt::issuer::TokenIssuer::rotate(&path)
                .with_context(|| format!("rotate the identity key {}", path.display()))?;
            let issuer = ate_api::jwt::issuer::TokenIssuer::load_or_create(&path, "ate-api")
                .with_context(|| format!("read the new identity key {}", path.display()))?;
            println!(
                "rotated: {} is a new key (kid {}); the old one is kept as .previous and stays in the JWKS; restart the api to sign with the new key",
                path.display(),
                issuer.kid()
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
