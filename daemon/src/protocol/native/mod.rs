//! Ringpost's native protocol: rkyv frames over TCP (`ringpost_wire`). The only part of the
//! daemon that names the wire crate: its handlers convert frames to the domain's operations
//! (`api`) and back, and the domain's limits, errors and stats to the wire's.

pub mod forwarder;
mod limits;
pub mod router;
mod stats;
mod status;

/// A command's name for metrics: its name in snake case (`streaming_pull`), or its number.
pub fn command_name(code: u16) -> String {
    match ringpost_wire::Command::from_u16(code) {
        Some(command) => snake_case(&format!("{command:?}")),
        None => format!("command_{code}"),
    }
}

/// A status code's name for metrics (`ok`, `not_found`, `not_owner`), or its number.
pub fn status_name(code: u16) -> String {
    match ringpost_wire::ErrorCode::from_u32(code.into()) {
        Some(status) => snake_case(&format!("{status:?}")),
        None => format!("code_{code}"),
    }
}

/// `CamelCase` as `camel_case`, the form metrics name commands and codes in.
pub(crate) fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if index > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
