//! A [`v1::GenerationDamage`] carried as the details of a failed call's status: how a node tells
//! the api, with the Restore's error, which copies of the generation it found damaged.

use prost::Message as _;
use tonic::Status;

use crate::v1;

/// `status` (its code and message unchanged) carrying `damage` as its details.
pub fn with_damage(status: Status, damage: &v1::GenerationDamage) -> Status {
    Status::with_details(
        status.code(),
        status.message(),
        tonic::codegen::Bytes::from(damage.encode_to_vec()),
    )
}

/// The damage a status carries: None when it has no details, or details that are not a
/// `GenerationDamage` naming a generation and at least one damaged copy.
pub fn damage_of(status: &Status) -> Option<v1::GenerationDamage> {
    let details = status.details();
    if details.is_empty() {
        return None;
    }
    v1::GenerationDamage::decode(details)
        .ok()
        .filter(|d| d.generation > 0 && (!d.local.is_empty() || !d.durable.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn damage_crosses_as_status_details() {
        let damage = v1::GenerationDamage {
            generation: 3,
            uuid: "u-3".into(),
            local: "rootfs.tar: sha256 x, manifest says y".into(),
            durable: String::new(),
        };
        let status = with_damage(Status::failed_precondition("restore failed"), &damage);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "restore failed");
        assert_eq!(damage_of(&status), Some(damage));
        // No details, other bytes, or a damage naming no copy: nothing.
        assert_eq!(damage_of(&Status::internal("x")), None);
        let junk = Status::with_details(
            Code::Internal,
            "x",
            tonic::codegen::Bytes::from_static(b"\xff\xff"),
        );
        assert_eq!(damage_of(&junk), None);
        let none = v1::GenerationDamage {
            generation: 3,
            ..Default::default()
        };
        assert_eq!(damage_of(&with_damage(Status::internal("x"), &none)), None);
    }
}
