//! The catalog's raft messages as bytes, for the cluster port: the same encoding of log ids,
//! entries and memberships the raft log stores (`store`), so that a message and a record can
//! never disagree. The bytes come from the network, so decoding refuses short input, unknown
//! tags and trailing bytes instead of trusting them.

use super::raft::{CatalogRaft, LogId, Snapshot, SnapshotMeta, StoredMembership, Vote};
use super::store::{decode_entry, encode_entry, get_log_id, get_membership, put_log_id, put_membership};
use crate::codec::{DecodeResult, Decoder, Encoder};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, VoteRequest,
    VoteResponse,
};

/// The most entries one AppendEntries may carry when decoded: openraft sends at most
/// `max_payload_entries` (300 by default), and a frame holds at most 16 MiB.
pub const PEER_ENTRIES_MAX: u32 = 4096;

const TAG_SUCCESS: u8 = 0;
const TAG_PARTIAL_SUCCESS: u8 = 1;
const TAG_CONFLICT: u8 = 2;
const TAG_HIGHER_VOTE: u8 = 3;

fn put_vote(encoder: &mut Encoder, vote: &Vote) {
    encoder.u64(vote.leader_id.term).u64(vote.leader_id.node_id).bool(vote.committed);
}

fn get_vote(decoder: &mut Decoder) -> DecodeResult<Vote> {
    let (term, node_id, committed) = (decoder.u64()?, decoder.u64()?, decoder.bool()?);
    let mut vote = Vote::new(term, node_id);
    vote.committed = committed;
    Ok(vote)
}

fn finish<T>(decoder: Decoder, value: T) -> DecodeResult<T> {
    if decoder.is_empty() {
        Ok(value)
    } else {
        Err("trailing bytes after the message")
    }
}

pub fn encode_append(request: &AppendEntriesRequest<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, &request.vote);
    put_log_id(&mut encoder, &request.prev_log_id);
    put_log_id(&mut encoder, &request.leader_commit);
    encoder.u32(request.entries.len() as u32);
    for entry in &request.entries {
        let bytes = encode_entry(entry);
        encoder.u32(bytes.len() as u32);
        encoder.0.extend_from_slice(&bytes);
    }
    encoder.0
}

pub fn decode_append(bytes: &[u8]) -> DecodeResult<AppendEntriesRequest<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let vote = get_vote(&mut decoder)?;
    let prev_log_id = get_log_id(&mut decoder)?;
    let leader_commit = get_log_id(&mut decoder)?;
    let count = decoder.u32()?;
    if count > PEER_ENTRIES_MAX {
        return Err("more entries than PEER_ENTRIES_MAX");
    }
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let length = decoder.u32()? as usize;
        let mut entry = Decoder::new(decoder.bytes(length)?);
        // The stored form starts with its record kind.
        entry.u8()?;
        entries.push(decode_entry(&mut entry)?);
    }
    finish(decoder, AppendEntriesRequest { vote, prev_log_id, entries, leader_commit })
}

pub fn encode_append_response(response: &AppendEntriesResponse<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    match response {
        AppendEntriesResponse::Success => {
            encoder.u8(TAG_SUCCESS);
        }
        AppendEntriesResponse::PartialSuccess(log_id) => {
            encoder.u8(TAG_PARTIAL_SUCCESS);
            put_log_id(&mut encoder, log_id);
        }
        AppendEntriesResponse::Conflict => {
            encoder.u8(TAG_CONFLICT);
        }
        AppendEntriesResponse::HigherVote(vote) => {
            encoder.u8(TAG_HIGHER_VOTE);
            put_vote(&mut encoder, vote);
        }
    }
    encoder.0
}

pub fn decode_append_response(bytes: &[u8]) -> DecodeResult<AppendEntriesResponse<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let response = match decoder.u8()? {
        TAG_SUCCESS => AppendEntriesResponse::Success,
        TAG_PARTIAL_SUCCESS => AppendEntriesResponse::PartialSuccess(get_log_id(&mut decoder)?),
        TAG_CONFLICT => AppendEntriesResponse::Conflict,
        TAG_HIGHER_VOTE => AppendEntriesResponse::HigherVote(get_vote(&mut decoder)?),
        _ => return Err("unknown AppendEntries answer"),
    };
    finish(decoder, response)
}

pub fn encode_vote(request: &VoteRequest<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, &request.vote);
    put_log_id(&mut encoder, &request.last_log_id);
    encoder.bool(request.leadership_transfer);
    encoder.0
}

pub fn decode_vote(bytes: &[u8]) -> DecodeResult<VoteRequest<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let vote = get_vote(&mut decoder)?;
    let last_log_id = get_log_id(&mut decoder)?;
    let leadership_transfer = decoder.bool()?;
    let mut request = VoteRequest::new(vote, last_log_id);
    request.leadership_transfer = leadership_transfer;
    finish(decoder, request)
}

pub fn encode_transfer_leader(request: &TransferLeaderRequest<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, request.from_leader());
    encoder.u64(*request.to_node_id());
    put_log_id(&mut encoder, &request.last_log_id().copied());
    encoder.0
}

pub fn decode_transfer_leader(bytes: &[u8]) -> DecodeResult<TransferLeaderRequest<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let from_leader = get_vote(&mut decoder)?;
    let to_node_id = decoder.u64()?;
    let last_log_id = get_log_id(&mut decoder)?;
    finish(decoder, TransferLeaderRequest::new(from_leader, to_node_id, last_log_id))
}

pub fn encode_vote_response(response: &VoteResponse<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, &response.vote);
    encoder.bool(response.vote_granted);
    put_log_id(&mut encoder, &response.last_log_id);
    encoder.0
}

pub fn decode_vote_response(bytes: &[u8]) -> DecodeResult<VoteResponse<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let vote = get_vote(&mut decoder)?;
    let vote_granted = decoder.bool()?;
    let last_log_id = get_log_id(&mut decoder)?;
    finish(decoder, VoteResponse { vote, vote_granted, last_log_id })
}

/// A whole snapshot with the vote of the leader that sends it.
pub fn encode_snapshot(vote: &Vote, snapshot: &Snapshot) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, vote);
    put_log_id(&mut encoder, &snapshot.meta.last_log_id);
    put_log_id(&mut encoder, snapshot.meta.last_membership.log_id());
    put_membership(&mut encoder, snapshot.meta.last_membership.membership());
    encoder.u32(snapshot.snapshot.len() as u32);
    encoder.0.extend_from_slice(&snapshot.snapshot);
    encoder.0
}

pub fn decode_snapshot(bytes: &[u8]) -> DecodeResult<(Vote, Snapshot)> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let vote = get_vote(&mut decoder)?;
    let last_log_id = get_log_id(&mut decoder)?;
    let membership_log_id = get_log_id(&mut decoder)?;
    let membership = get_membership(&mut decoder)?;
    let length = decoder.u32()? as usize;
    let data = decoder.bytes(length)?.to_vec();
    let meta =
        SnapshotMeta { last_log_id, last_membership: StoredMembership::new(membership_log_id, membership) };
    finish(decoder, (vote, Snapshot { meta, snapshot: data }))
}

pub fn encode_snapshot_response(response: &SnapshotResponse<CatalogRaft>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_vote(&mut encoder, &response.vote);
    encoder.0
}

pub fn decode_snapshot_response(bytes: &[u8]) -> DecodeResult<SnapshotResponse<CatalogRaft>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let vote = get_vote(&mut decoder)?;
    finish(decoder, SnapshotResponse { vote })
}

/// The leader's read index: the log id a reader must have applied to see every write committed
/// before it asked.
pub fn encode_read_index(log_id: &Option<LogId>) -> Vec<u8> {
    let mut encoder = Encoder::new(0);
    put_log_id(&mut encoder, log_id);
    encoder.0
}

pub fn decode_read_index(bytes: &[u8]) -> DecodeResult<Option<LogId>> {
    let mut decoder = Decoder::new(bytes);
    decoder.u8()?;
    let log_id = get_log_id(&mut decoder)?;
    finish(decoder, log_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::raft::{Entry, Membership};
    use openraft::vote::leader_id_adv::LeaderId;
    use openraft::EntryPayload;
    use std::collections::BTreeSet;

    fn log_id(term: u64, node_id: u64, index: u64) -> LogId {
        LogId::new(LeaderId { term, node_id }, index)
    }

    #[test]
    fn every_message_decodes_to_what_was_encoded_and_every_cut_is_refused() {
        let mut vote = Vote::new(7, 2);
        vote.committed = true;
        let membership = Membership::new_with_defaults(vec![BTreeSet::from([1, 2, 3])], vec![]);
        let entries = vec![
            Entry { log_id: log_id(7, 2, 10), payload: EntryPayload::Blank },
            Entry { log_id: log_id(7, 2, 11), payload: EntryPayload::Membership(membership.clone()) },
            Entry {
                log_id: log_id(7, 2, 12),
                payload: EntryPayload::Normal(crate::catalog::tests::topic(5, 1)),
            },
        ];
        let append = AppendEntriesRequest {
            vote,
            prev_log_id: Some(log_id(6, 1, 9)),
            entries,
            leader_commit: Some(log_id(6, 1, 8)),
        };
        let encoded = encode_append(&append);
        assert_eq!(format!("{:?}", decode_append(&encoded).unwrap()), format!("{append:?}"));
        for cut in 0..encoded.len() {
            assert!(decode_append(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert!(decode_append(&longer).is_err());

        for answer in [
            AppendEntriesResponse::Success,
            AppendEntriesResponse::PartialSuccess(Some(log_id(3, 1, 4))),
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(vote),
        ] {
            let encoded = encode_append_response(&answer);
            assert_eq!(decode_append_response(&encoded).unwrap(), answer);
            assert!(decode_append_response(&encoded[..encoded.len() - 1]).is_err());
        }

        let mut request = VoteRequest::new(Vote::new(8, 3), Some(log_id(7, 2, 12)));
        request.leadership_transfer = true;
        let encoded = encode_vote(&request);
        assert_eq!(decode_vote(&encoded).unwrap(), request);
        let answer = VoteResponse { vote, vote_granted: true, last_log_id: None };
        assert_eq!(decode_vote_response(&encode_vote_response(&answer)).unwrap(), answer);

        let transfer = TransferLeaderRequest::new(vote, 3, Some(log_id(7, 2, 12)));
        let encoded = encode_transfer_leader(&transfer);
        let decoded = decode_transfer_leader(&encoded).unwrap();
        assert_eq!(
            (decoded.from_leader(), decoded.to_node_id(), decoded.last_log_id()),
            (transfer.from_leader(), transfer.to_node_id(), transfer.last_log_id())
        );
        assert!(decode_transfer_leader(&encoded[..encoded.len() - 1]).is_err());

        let snapshot = Snapshot {
            meta: SnapshotMeta {
                last_log_id: Some(log_id(7, 2, 12)),
                last_membership: StoredMembership::new(Some(log_id(7, 2, 11)), membership),
            },
            snapshot: vec![1, 2, 3, 4],
        };
        let encoded = encode_snapshot(&vote, &snapshot);
        let (decoded_vote, decoded) = decode_snapshot(&encoded).unwrap();
        assert_eq!((decoded_vote, format!("{decoded:?}")), (vote, format!("{snapshot:?}")));
        for cut in 0..encoded.len() {
            assert!(decode_snapshot(&encoded[..cut]).is_err(), "a cut at {cut} decoded");
        }
        let answer = SnapshotResponse { vote };
        assert_eq!(decode_snapshot_response(&encode_snapshot_response(&answer)).unwrap(), answer);
        let index = Some(log_id(9, 1, 40));
        assert_eq!(decode_read_index(&encode_read_index(&index)).unwrap(), index);
    }
}
