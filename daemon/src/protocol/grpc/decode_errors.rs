//! A request whose protobuf does not decode is the client's fault: Pub/Sub answers it
//! `INVALID_ARGUMENT`, while tonic's prost codec answers `INTERNAL` (gRPC's guidance for a
//! codec's failure, which reads as the server's). `rewrite` gives such an answer the client's
//! code, keeping its message.
//!
//! A unary call (or a server stream) that fails to decode its request answers before any message,
//! with the status in the response's headers (a trailers-only response), which is where the
//! counting layer (`counting::Counting`, outside every other) rewrites it before counting it as
//! the client's. A client stream (StreamingPull) decodes its requests in the
//! handler, which maps the same error with `refusal_of_bad_request` itself.

/// How tonic's prost codec begins the message of a request that does not decode
/// (`prost::DecodeError`'s display).
const DECODE_FAILURE_PREFIX: &str = "failed to decode Protobuf message";
/// What tonic answers a unary call whose body ends before a whole message.
const MISSING_MESSAGE: &str = "Missing request message.";

/// The status a client should see for `status`: a request that did not decode, or carried no
/// message, is `INVALID_ARGUMENT`; anything else is unchanged.
pub fn refusal_of_bad_request(status: tonic::Status) -> tonic::Status {
    let bad_request = status.code() == tonic::Code::Internal
        && (status.message().starts_with(DECODE_FAILURE_PREFIX) || status.message() == MISSING_MESSAGE);
    if !bad_request {
        return status;
    }
    tonic::Status::invalid_argument(format!(
        "the request is not a valid protobuf message: {}",
        status.message()
    ))
}

/// Rewrites a trailers-only answer's status in `headers` if it is a request that did not decode.
pub fn rewrite(headers: &mut http::HeaderMap) {
    // Only a failed call's headers carry a status; a successful one's come in its trailers.
    if headers.get("grpc-status").is_none_or(|code| code.as_bytes() != b"13") {
        return;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else { return };
    let refusal = refusal_of_bad_request(status);
    if refusal.code() == tonic::Code::InvalidArgument {
        let _ = refusal.add_header(headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_does_not_decode_is_invalid_argument_and_other_internal_errors_stay() {
        use prost::Message;
        let decode = ringpost_proto::pubsub::Topic::decode(&[0x0f, 0x01][..]).unwrap_err();
        let mut headers = http::HeaderMap::new();
        tonic::Status::internal(decode.to_string()).add_header(&mut headers).unwrap();
        rewrite(&mut headers);
        let status = tonic::Status::from_header_map(&headers).unwrap();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(&decode.to_string()), "{}", status.message());

        let mut headers = http::HeaderMap::new();
        tonic::Status::internal("the journal failed").add_header(&mut headers).unwrap();
        rewrite(&mut headers);
        assert_eq!(tonic::Status::from_header_map(&headers).unwrap().code(), tonic::Code::Internal);

        let missing = refusal_of_bad_request(tonic::Status::internal(MISSING_MESSAGE));
        assert_eq!(missing.code(), tonic::Code::InvalidArgument);
        let other = refusal_of_bad_request(tonic::Status::not_found("x"));
        assert_eq!(other.code(), tonic::Code::NotFound);
    }
}
