//! Routing restrictions as the catalog keeps them (`CatalogEntry::RoutingRulesSet`): rules saying
//! which clients, by principal or by source address range, may or may not be handed which
//! nodes' forwarders. What they decide is `router::restrictions`.

use crate::codec::{DecodeResult, Decoder, Encoder};
use crate::ids::NodeId;
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The most routing rules the catalog holds: each lookup reads every one.
pub const ROUTING_RULES_MAX: usize = 64;

/// The longest principal name a routing rule holds, in bytes (a token's name or a
/// certificate's identity; longer is refused rather than kept in every catalog copy).
pub const ROUTING_PRINCIPAL_BYTES_MAX: usize = 256;

/// A source address range, `ADDRESS/PREFIX` (IPv4 or IPv6), its address bits past the prefix
/// zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cidr {
    pub address: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `ADDRESS/PREFIX`, or an address alone (a range of one), refusing a prefix longer
    /// than the address and address bits set past the prefix (`10.0.0.1/8` is a mistake for
    /// `10.0.0.0/8` or `10.0.0.1/32`).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().map_err(|_| format!("'{text}' is not ADDRESS/PREFIX"))?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|prefix| *prefix <= bits)
                .ok_or_else(|| format!("'{text}': the prefix is 0 to {bits}"))?,
        };
        let cidr = Cidr { address, prefix };
        if masked(address, prefix) != address {
            return Err(format!(
                "'{text}' has address bits set past its prefix: {}",
                Cidr { address: masked(address, prefix), prefix }
            ));
        }
        Ok(cidr)
    }

    /// Whether `address` is in the range (an IPv4 address seen as IPv6, `::ffff:a.b.c.d`, is
    /// taken as the IPv4 one).
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        address.is_ipv4() == self.address.is_ipv4() && masked(address, self.prefix) == self.address
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

fn masked(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// Which clients a rule is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClientSelector {
    /// Clients authenticated as this principal (a token's name in the access file, a client
    /// certificate's identity; `anonymous` for those that presented none).
    Principal(String),
    /// Clients connecting from an address in this range.
    From(Cidr),
}

impl std::fmt::Display for ClientSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientSelector::Principal(name) => write!(f, "principal {name}"),
            ClientSelector::From(cidr) => write!(f, "from {cidr}"),
        }
    }
}

/// One rule: the clients `selector` picks may be handed only `nodes`' forwarders (`allow`), or
/// none of `nodes`' forwarders (deny).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RoutingRule {
    pub selector: ClientSelector,
    pub allow: bool,
    pub nodes: BTreeSet<NodeId>,
}

impl std::fmt::Display for RoutingRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|node| node.to_string()).collect();
        let effect = if self.allow { "allow" } else { "deny" };
        write!(f, "{} {effect} {}", self.selector, nodes.join(","))
    }
}

const SELECTOR_PRINCIPAL: u8 = 0;
const SELECTOR_FROM: u8 = 1;

pub(super) fn encode_rules<'a>(encoder: &'a mut Encoder, rules: &[RoutingRule]) -> &'a mut Encoder {
    encoder.u32(rules.len() as u32);
    for rule in rules {
        match &rule.selector {
            ClientSelector::Principal(name) => encoder.u8(SELECTOR_PRINCIPAL).str(name),
            ClientSelector::From(cidr) => encoder.u8(SELECTOR_FROM).str(&cidr.to_string()),
        };
        encoder.bool(rule.allow).u32(rule.nodes.len() as u32);
        for node in &rule.nodes {
            encoder.u64(node.get());
        }
    }
    encoder
}

pub(super) fn decode_rules(d: &mut Decoder) -> DecodeResult<Vec<RoutingRule>> {
    let count = d.u32()? as usize;
    if count > ROUTING_RULES_MAX {
        return Err("more routing rules than ROUTING_RULES_MAX");
    }
    let mut rules = Vec::with_capacity(count);
    for _ in 0..count {
        let selector = match d.u8()? {
            SELECTOR_PRINCIPAL => ClientSelector::Principal(d.str()?),
            SELECTOR_FROM => ClientSelector::From(
                Cidr::parse(&d.str()?).map_err(|_| "a routing rule's range does not parse")?,
            ),
            _ => return Err("unknown routing rule selector"),
        };
        let allow = d.bool()?;
        let node_count = d.u32()? as usize;
        if node_count > crate::router::NODE_ID_MAX as usize {
            return Err("a routing rule naming more nodes than there are");
        }
        let mut nodes = BTreeSet::new();
        for _ in 0..node_count {
            nodes.insert(NodeId::new(d.u64()?));
        }
        rules.push(RoutingRule { selector, allow, nodes });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges parse with or without a prefix, refuse bits past it and prefixes too long, and
    /// match IPv4 addresses however they arrive.
    #[test]
    fn ranges_parse_strictly_and_match_their_addresses() {
        let lan = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(lan.contains("10.1.200.3".parse().unwrap()));
        assert!(!lan.contains("10.2.0.1".parse().unwrap()));
        assert!(lan.contains("::ffff:10.1.0.9".parse().unwrap()), "IPv4 seen as IPv6");
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("192.0.2.1".parse().unwrap()));
        assert!(!Cidr::parse("0.0.0.0/0").unwrap().contains("2001:db8::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!(one.contains("127.0.0.1".parse().unwrap()) && !one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("2001:db8::/32").unwrap().contains("2001:db8:5::1".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.1/8").unwrap_err().contains("10.0.0.0/8"));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("ten/8").is_err());
    }
}
