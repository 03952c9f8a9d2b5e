//! `--deny-egress` entries: IP networks of either family, parsed strictly.

use std::net::{IpAddr, Ipv4Addr};

pub(super) fn in_cidr(ip: Ipv4Addr, net: Ipv4Addr, bits: u8) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(bits))
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// One `--deny-egress` entry: an IP address or an `IP/prefix` network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

/// Why a `--deny-egress` entry did not parse (the message names the entry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("empty entry (a stray comma?)")]
    Empty,
    #[error("{0:?} is not an IP address or IP/prefix-length")]
    Syntax(String),
    #[error("{entry:?}: prefix length {bits} is longer than {max}")]
    PrefixTooLong { entry: String, bits: u8, max: u8 },
    #[error("{entry:?} has bits set past the prefix length (the network is {network})")]
    HostBits { entry: String, network: Cidr },
}

impl Cidr {
    /// Whether `ip` is inside this network (an IPv4-mapped IPv6 address counts as its IPv4 one;
    /// otherwise the families never match).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => in_cidr(ip, net, self.bits),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let entry = text.trim();
        if entry.is_empty() {
            return Err(CidrError::Empty);
        }
        let syntax = || CidrError::Syntax(entry.to_string());
        let (ip, bits) = match entry.split_once('/') {
            Some((ip, bits)) => (
                ip.parse::<IpAddr>().map_err(|_| syntax())?,
                Some(bits.parse::<u8>().map_err(|_| syntax())?),
            ),
            None => (entry.parse::<IpAddr>().map_err(|_| syntax())?, None),
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(CidrError::PrefixTooLong {
                entry: entry.to_string(),
                bits,
                max,
            });
        }
        // An IPv4-mapped network (`::ffff:a.b.c.d/104`) is the IPv4 one: destinations are
        // compared in canonical form.
        let (net, bits) = match ip {
            IpAddr::V6(v6) if bits >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), bits - 96),
                None => (ip, bits),
            },
            _ => (ip, bits),
        };
        let masked = Cidr {
            net: mask_ip(net, bits),
            bits,
        };
        // A set host bit usually means a typo in the prefix: refuse rather than guess.
        if masked.net != net {
            return Err(CidrError::HostBits {
                entry: entry.to_string(),
                network: masked,
            });
        }
        Ok(masked)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

fn mask_ip(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// The first `--deny-egress` entry holding `ip`, if any.
pub fn control_plane(denied: &[Cidr], ip: IpAddr) -> Option<&Cidr> {
    denied.iter().find(|c| c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parses_ips_and_networks() {
        let c = |s: &str| s.parse::<Cidr>();
        assert_eq!(c("10.1.2.3").expect("ip").to_string(), "10.1.2.3/32");
        assert_eq!(c(" 10.1.0.0/16 ").expect("net").to_string(), "10.1.0.0/16");
        assert_eq!(c("0.0.0.0/0").expect("all").to_string(), "0.0.0.0/0");
        assert_eq!(c("2001:db8::1").expect("v6").to_string(), "2001:db8::1/128");
        assert_eq!(
            c("2001:db8::/32").expect("v6 net").to_string(),
            "2001:db8::/32"
        );
        // IPv4-mapped is the IPv4 network.
        assert_eq!(
            c("::ffff:10.1.0.0/112").expect("mapped").to_string(),
            "10.1.0.0/16"
        );
        assert_eq!(c(""), Err(CidrError::Empty));
        for bad in [
            "10.1.2",
            "10.1.2.3/",
            "10.1.2.3/x",
            "db.internal",
            "10.0.0.300/8",
        ] {
            assert!(
                matches!(c(bad), Err(CidrError::Syntax(ref e)) if e == bad),
                "{bad}"
            );
        }
        assert!(matches!(
            c("10.0.0.0/33"),
            Err(CidrError::PrefixTooLong { .. })
        ));
        assert!(matches!(c("::/129"), Err(CidrError::PrefixTooLong { .. })));
        let err = c("10.1.2.3/16").expect_err("host bits");
        assert_eq!(
            err.to_string(),
            "\"10.1.2.3/16\" has bits set past the prefix length (the network is 10.1.0.0/16)"
        );
    }

    #[test]
    fn cidr_contains() {
        let net: Cidr = "10.1.0.0/16".parse().expect("net");
        assert!(net.contains("10.1.255.255".parse().expect("ip")));
        assert!(!net.contains("10.2.0.0".parse().expect("ip")));
        assert!(net.contains("::ffff:10.1.2.3".parse().expect("mapped")));
        assert!(!net.contains("2001:db8::1".parse().expect("ip")));
        let v6: Cidr = "2001:db8::/32".parse().expect("v6");
        assert!(v6.contains("2001:db8:ffff::1".parse().expect("ip")));
        assert!(!v6.contains("2001:db9::1".parse().expect("ip")));
        assert!(!v6.contains("10.1.2.3".parse().expect("ip")));
        let all: Cidr = "0.0.0.0/0".parse().expect("all");
        assert!(all.contains("203.0.113.9".parse().expect("ip")));
    }
}
