//! The request id (DESIGN §8): one id per client request, on every log line of that request in
//! every component. The router keeps a client's `x-request-id` when it is acceptable
//! ([`is_valid`]) or makes one ([`hex_id`] of 128 random bits); it travels to the actor as that
//! header, back to the client on the response, and router → api → node → worker as gRPC metadata
//! of the same name.

/// HTTP header and gRPC metadata key carrying the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Longest request id kept, in bytes.
pub const MAX_LEN: usize = 128;

/// Length of a generated id: 128 bits in lowercase hex.
pub const GENERATED_LEN: usize = 32;

/// A request id a client may choose: 1 to [`MAX_LEN`] printable ASCII characters, no space (so it
/// is one token in a log line, a valid header value and valid gRPC ASCII metadata).
pub fn is_valid(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// `random` as 32 lowercase hex digits, most significant first (no allocation).
pub fn hex_id(random: u128) -> [u8; GENERATED_LEN] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; GENERATED_LEN];
    for (i, digit) in out.iter_mut().enumerate() {
        let shift = 4 * (GENERATED_LEN - 1 - i);
        *digit = DIGITS[((random >> shift) & 0xf) as usize];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids() {
        assert!(is_valid(b"test-123"));
        assert!(is_valid(b"a"));
        assert!(is_valid(&[b'x'; MAX_LEN]));
        assert!(is_valid(b"{\"json\":[1,2]}~!"));
        assert!(!is_valid(b""));
        assert!(!is_valid(&[b'x'; MAX_LEN + 1]));
        assert!(!is_valid(b"with space"));
        assert!(!is_valid(b"tab\there"));
        assert!(!is_valid(b"del\x7f"));
        assert!(!is_valid("é".as_bytes()));
    }

    #[test]
    fn hex_ids() {
        assert_eq!(&hex_id(0), b"00000000000000000000000000000000");
        assert_eq!(&hex_id(u128::MAX), b"ffffffffffffffffffffffffffffffff");
        assert_eq!(
            &hex_id(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            b"0123456789abcdef0011223344556677"
        );
        assert!(is_valid(&hex_id(42)));
    }
}
