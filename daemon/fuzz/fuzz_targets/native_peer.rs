//! The rest of the cluster port (`net::peer`, `dispatch::codec`): cluster status, carried operations and
//! their answers, requests for elections.
//! An input is bytes for the decoders as they are, or a valid message changed by the edits the
//! input encodes (`ringpost_daemon::fuzzing::fuzz`). No decoder may panic, and what decodes
//! must encode to bytes that decode to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringpost_daemon::fuzzing::{fuzz, Family};

fuzz_target!(|data: &[u8]| fuzz(Family::NativePeer, data));
