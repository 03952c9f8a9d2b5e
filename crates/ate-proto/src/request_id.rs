//! The request id as gRPC metadata (`x-request-id`, [`ate_core::REQUEST_ID_HEADER`]): read at a
//! server, passed on by its calls to the next component.

use ate_core::REQUEST_ID_HEADER;
use ate_core::request_id::is_valid;
use tonic::metadata::MetadataValue;

/// The request id a call carries, if it carries an acceptable one
/// ([`ate_core::request_id::is_valid`]).
pub fn of<T>(request: &tonic::Request<T>) -> Option<&str> {
    request
        .metadata()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| is_valid(id.as_bytes()))
}

/// `message` as a call carrying `id` as metadata (nothing when `id` is None or not acceptable).
pub fn request<T>(message: T, id: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    set(&mut request, id);
    request
}

/// Adds `id` to `request`'s metadata (nothing when `id` is None or not acceptable).
pub fn set<T>(request: &mut tonic::Request<T>, id: Option<&str>) {
    if let Some(value) = id
        .filter(|id| is_valid(id.as_bytes()))
        .and_then(|id| MetadataValue::try_from(id).ok())
    {
        request.metadata_mut().insert(REQUEST_ID_HEADER, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = request((), Some("test-123"));
        assert_eq!(of(&r), Some("test-123"));
        assert_eq!(of(&request((), None)), None);
        assert_eq!(of(&request((), Some("has space"))), None);
        let mut r = tonic::Request::new(());
        r.metadata_mut()
            .insert(REQUEST_ID_HEADER, MetadataValue::from_static("bad id"));
        assert_eq!(of(&r), None);
    }
}
