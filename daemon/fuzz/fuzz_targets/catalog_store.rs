//! The catalog's raft log as its recovery reads it back (`catalog::store`): a series of records,
//! each a two-byte length and its bytes.
//! An input is bytes for the decoders as they are, or a valid message changed by the edits the
//! input encodes (`ringpost_daemon::fuzzing::fuzz`). No record may make the recovery panic:
//! one that does not decode is an error.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringpost_daemon::fuzzing::{fuzz, Family};

fuzz_target!(|data: &[u8]| fuzz(Family::CatalogStore, data));
