//! One connection's life: its reading loop, each request dispatched as a task of its own,
//! Authenticate answered in line, and its close with what it held given back.

use super::*;

/// Serves one connection until its peer goes, it breaks a limit, its session ends, or the
/// shard stops. Returns whether it authenticated.
pub(super) async fn serve_connection<H: Handler, S: Transport>(
    stream: S,
    accepted: Accepted,
    handler: Rc<H>,
    stop: Stop,
    shard: &Shard,
) -> bool {
    let Accepted { socket, peer, local_address, at, link, certified } = accepted;
    let (mut reader, writer) = futures_lite::io::split(stream);
    let outbound = Rc::new(Outbound::default());
    let stall = Stall {
        deadline: shard.limits.write_stall_deadline,
        stop: stop.clone(),
        stopping: link.stopping.clone(),
    };
    let writer_task = crate::runtime::spawn(write_responses(writer, socket, outbound.clone(), stall));
    let watch = Rc::new(Watch::new(at + shard.limits.unauthenticated_deadline, shard.limits.idle_deadline));
    let mut connection = Connection {
        handler,
        outbound: outbound.clone(),
        in_flight: Rc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX)),
        session: link.session.borrow().clone(),
        access: shard.access.clone(),
        local_address,
        peer_address: peer,
        link: link.clone(),
        watch: watch.clone(),
    };
    let watchdog = crate::runtime::spawn(watch_deadline(watch.clone(), socket));
    let mut reading = Reading::new(shard, socket, link.clone(), S::PLAINTEXT, at);
    if certified.is_some() {
        reading.authenticate();
        let deadline = reading.deadline(crate::runtime::now(), false);
        watch.set_kind(deadline, reading.deadline_kind == Deadline::Idle);
    }
    // Once the shard is told to stop, nothing more is read (`serve` shuts the socket's reading
    // side, so a pending read ends): the requests read so far run and are answered, and the
    // connection closes after them.
    'reading: while !outbound.closed.get() && !stop.is_given() {
        let frames = match reading.read_batch(&mut reader).await {
            Ok(frames) => frames,
            Err(refusal) => {
                reading.refusal = refusal;
                break;
            }
        };
        let completed = !frames.is_empty();
        for frame in frames {
            if frame.header.is_response() {
                let status = Status::new(ErrorCode::ProtocolError, "a client sent a response frame");
                outbound.push(fail(&frame.header, &status), None);
                break 'reading;
            }
            // The shard is behind, not the peer: its deadlines wait while it catches up.
            let waiting = (connection.in_flight.available() == 0).then(|| {
                watch.set(at + Duration::from_secs(365 * 24 * 3600));
                crate::runtime::now()
            });
            let Ok(permit) = connection.in_flight.clone().acquire_static_permit(1).await else {
                break 'reading;
            };
            if outbound.broken.get() {
                // Nobody reads the answers any more (the permit came back with the queue).
                break 'reading;
            }
            if let Some(waiting) = waiting {
                reading.postpone(crate::runtime::now() - waiting);
            }
            if frame.header.command == Command::Authenticate.code() {
                if !connection.authenticate(frame, permit, &mut reading) {
                    break 'reading;
                }
                continue;
            }
            connection.dispatch(frame, permit);
        }
        if reading.refusal.is_none() {
            reading.refusal = reading.unauthenticated_refusal();
        }
        if reading.refusal.is_some() {
            break;
        }
        let deadline = reading.deadline(crate::runtime::now(), completed);
        watch.set_kind(deadline, reading.deadline_kind == Deadline::Idle);
    }
    watch.finish();
    watchdog.await;
    if let Some(ending) = link.ending.borrow_mut().take() {
        reading.refusal = Some(ending);
    } else if watch.expired.get() && !stop.is_given() {
        reading.refusal = Some(reading.deadline_status());
    }
    if let Some(status) = reading.refusal.take() {
        outbound.push(encode_error(0, 0, &status), None);
    }
    shard.charge_partial(reading.charged, 0);
    let authenticated = reading.authenticated;
    drop(reading);
    // The peer is done sending: streams stop; requests already running finish and answer;
    // then the connection closes.
    outbound.peer_left();
    let _ = connection.in_flight.acquire(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX).await;
    outbound.close();
    writer_task.await;
    if outbound.stalled.get() {
        log_write_stall(shard, peer, &stop);
    }
    authenticated
}

/// One rate-limited line about a connection reset because its socket took nothing for the
/// write-stall deadline (the shorter one once the shard stops).
fn log_write_stall(shard: &Shard, peer: Option<IpAddr>, stop: &Stop) {
    if let Some(suppressed) = shard.write_stalls.borrow_mut().admit() {
        let peer = peer.map_or_else(|| "a client".to_owned(), |peer| peer.to_string());
        let limit = shard.limits.write_stall_deadline;
        let deadline = if stop.is_given() { limit.min(WRITE_STALL_DEADLINE_STOPPING) } else { limit };
        crate::log_info!(
            "ringpostd: reset a connection from {peer}: its socket took no byte for {} ms while answers \
             waited (write_stall_deadline) ({suppressed} more not logged since the last line)",
            deadline.as_millis()
        );
    }
}

/// What one connection's requests are dispatched with: its handler, its responses' queue, its
/// bound on requests in flight, and who it acts as now.
struct Connection<H> {
    handler: Rc<H>,
    outbound: Rc<Outbound>,
    in_flight: Rc<Semaphore>,
    session: Rc<Session>,
    access: Rc<Access>,
    local_address: Option<SocketAddr>,
    /// The peer's address, which routing restrictions match on.
    peer_address: Option<std::net::IpAddr>,
    link: Rc<Link>,
    /// The connection's deadlines, which its open streams suspend the idle one of.
    watch: Rc<Watch>,
}

impl<H: Handler> Connection<H> {
    /// Runs one request as its own task, as the connection's session is now.
    fn dispatch(&self, frame: Frame, permit: StaticPermit) {
        let handler = self.handler.clone();
        let outbound = self.outbound.clone();
        let responder = Responder {
            outbound: outbound.clone(),
            local_address: self.local_address,
            peer_address: self.peer_address,
            session: self.session.clone(),
            access: self.access.clone(),
        };
        let command = frame.header.command;
        let stream = command == Command::StreamingPull.code();
        // A stream the client keeps open is not idleness, however quiet its subscription: the
        // idle deadline waits while one is open (a dead peer is found by TCP keepalive).
        let open_stream = stream.then(|| OpenStream::new(self.watch.clone()));
        crate::runtime::spawn(async move {
            let started = crate::runtime::now();
            let response = handler.handle(frame.header, frame.body, &responder).await;
            drop(open_stream);
            // A stream's time is its subscriber's session, not a latency.
            let timed = !stream;
            crate::metrics::requests::record(
                command,
                response_code(&response),
                timed.then(|| crate::runtime::now() - started),
            );
            let closes = is_protocol_error(&response);
            outbound.push(response, Some(permit));
            if closes {
                // The stream may still be in step, but a peer that sends malformed bodies
                // is not trusted with more.
                outbound.close();
            }
        })
        .detach();
    }

    /// Answers an Authenticate before the frames after it are dispatched: on success the
    /// connection acts as the token's holder from the next frame on; on failure it answers
    /// `Unauthenticated` and closes (false).
    pub(super) fn authenticate(&mut self, frame: Frame, permit: StaticPermit, reading: &mut Reading) -> bool {
        let session = access_body::<AuthenticateRequest>(&frame.body)
            .map_err(|status| Status::new(ErrorCode::Unauthenticated, status.message))
            .and_then(|request| self.access.authenticate_token(request.token.as_str()).map_err(Status::from));
        match session {
            Ok(session) => {
                let principal = session.principal.to_string();
                self.session = Rc::new(session);
                *self.link.session.borrow_mut() = self.session.clone();
                reading.authenticate();
                self.outbound.push(respond(&frame.header, &AuthenticateResponse { principal }), Some(permit));
                true
            }
            Err(status) => {
                let closing = format!("authentication failed, the connection closes: {}", status.message);
                self.outbound.push(fail(&frame.header, &status), Some(permit));
                reading.refusal = Some(Status::new(ErrorCode::Unauthenticated, closing));
                false
            }
        }
    }
}

/// The status code a response answers with (0 for any answer that is not an error).
fn response_code(response: &Response) -> u16 {
    let Response::Frame(frame) = response else { return 0 };
    match FrameHeader::decode(frame) {
        Ok(header) if header.is_error() => {
            ringpost_wire::frame::decode_error(&frame[ringpost_wire::limits::FRAME_HEADER_BYTES..]).code
                as u16
        }
        _ => 0,
    }
}

fn is_protocol_error(response: &Response) -> bool {
    let Response::Frame(frame) = response else { return false };
    match FrameHeader::decode(frame) {
        Ok(header) if header.is_error() => {
            let status =
                ringpost_wire::frame::decode_error(&frame[ringpost_wire::limits::FRAME_HEADER_BYTES..]);
            status.code == ErrorCode::ProtocolError
        }
        _ => false,
    }
}
