//! Measures the loopback TCP ceiling: the bytes per second that connections over 127.0.0.1
//! carry on this machine with nothing else to do, the bound on any publish or delivery rate a
//! load generator on the same machine can measure.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Each write and read moves this much, like a large publish batch.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Longest wait for one connection to arrive, or for one read or write to make progress. The
/// threads wait on each other: without a bound, one failed connect or accept left the others
/// blocked for good, and the measurement with them.
pub const LOOPBACK_STALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct LoopbackOptions {
    /// Bytes to send over each connection.
    pub bytes_per_connection: u64,
    /// Connections, each with a sending and a receiving thread.
    pub connections: usize,
}

impl Default for LoopbackOptions {
    fn default() -> Self {
        LoopbackOptions { bytes_per_connection: 1 << 30, connections: 1 }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoopbackResult {
    pub connections: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_sec: f64,
}

/// Sends `bytes_per_connection` over each of `connections` loopback connections at once and
/// times it from the first connection made to the last byte received.
pub fn measure(options: &LoopbackOptions) -> io::Result<LoopbackResult> {
    if options.connections == 0 || options.bytes_per_connection == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "connections and bytes must be above 0"));
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let started = Instant::now();
    let received: io::Result<u64> = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..options.connections)
            .map(|_| {
                scope.spawn(move || -> io::Result<()> {
                    let mut stream = TcpStream::connect_timeout(&address, LOOPBACK_STALL_TIMEOUT)?;
                    stream.set_nodelay(true)?;
                    stream.set_write_timeout(Some(LOOPBACK_STALL_TIMEOUT))?;
                    let chunk = vec![0x5au8; CHUNK_BYTES];
                    let mut left = options.bytes_per_connection;
                    while left > 0 {
                        let now = left.min(CHUNK_BYTES as u64) as usize;
                        stream.write_all(&chunk[..now])?;
                        left -= now as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        let receivers: Vec<_> = (0..options.connections)
            .map(|_| {
                let mut stream = accept_within(&listener, LOOPBACK_STALL_TIMEOUT)?;
                stream.set_read_timeout(Some(LOOPBACK_STALL_TIMEOUT))?;
                Ok(scope.spawn(move || -> io::Result<u64> {
                    let mut buffer = vec![0u8; CHUNK_BYTES];
                    let mut total = 0u64;
                    loop {
                        match stream.read(&mut buffer)? {
                            0 => return Ok(total),
                            read => total += read as u64,
                        }
                    }
                }))
            })
            .collect::<io::Result<_>>()?;
        for sender in senders {
            sender.join().map_err(|_| io::Error::other("a sender thread panicked"))??;
        }
        let mut total = 0;
        for receiver in receivers {
            total += receiver.join().map_err(|_| io::Error::other("a receiver thread panicked"))??;
        }
        Ok(total)
    });
    let bytes = received?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(LoopbackResult {
        connections: options.connections,
        bytes,
        seconds,
        mb_per_sec: bytes as f64 / seconds / 1e6,
    })
}

/// Largest request or answer `measure_requests` sends: the server's read buffer holds several.
pub const REQUEST_BYTES_MAX: usize = 64 << 10;

#[derive(Debug, Clone)]
pub struct RequestLoopbackOptions {
    /// Requests to send over each connection.
    pub requests_per_connection: u64,
    /// Connections, each with a writing and a reading thread on the client's side and one
    /// answering thread on the server's, as the client library and a server that does nothing.
    pub connections: usize,
    /// Bytes of each request, its 4-byte length included (a 1 KiB publish is about 1,100).
    pub request_bytes: usize,
    /// Bytes of each answer, its 4-byte length included (a publish's answer is about 64).
    pub response_bytes: usize,
    /// Requests each connection keeps unanswered at most.
    pub in_flight: usize,
}

impl Default for RequestLoopbackOptions {
    fn default() -> Self {
        RequestLoopbackOptions {
            requests_per_connection: 250_000,
            connections: 4,
            request_bytes: 1_100,
            response_bytes: 64,
            in_flight: 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestLoopbackResult {
    pub connections: usize,
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_sec: f64,
}

/// The request ceiling of loopback TCP: each connection's writer sends length-prefixed requests
/// while fewer than `in_flight` are unanswered, every request it may send in one write (as the
/// client's writer thread sends what its publishers queued); the server's thread answers each
/// complete request it read, the answers of one read in one write; the client's reader counts
/// them. Nothing is done with a request, so no request-per-request protocol over these
/// connections on this machine, with its client beside it, can go faster.
pub fn measure_requests(options: &RequestLoopbackOptions) -> io::Result<RequestLoopbackResult> {
    let valid = options.connections > 0
        && options.requests_per_connection > 0
        && options.in_flight > 0
        && (4..=REQUEST_BYTES_MAX).contains(&options.request_bytes)
        && (4..=REQUEST_BYTES_MAX).contains(&options.response_bytes);
    if !valid {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "connections, requests and in flight must be above 0, and each message 4 bytes (its \
                 length) to {REQUEST_BYTES_MAX}"
            ),
        ));
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let started = Instant::now();
    let answered: io::Result<u64> = std::thread::scope(|scope| {
        let clients: Vec<_> =
            (0..options.connections).map(|_| scope.spawn(move || request_client(address, options))).collect();
        let servers: Vec<_> = (0..options.connections)
            .map(|_| {
                let stream = accept_within(&listener, LOOPBACK_STALL_TIMEOUT)?;
                Ok(scope.spawn(move || answer_requests(stream, options.response_bytes)))
            })
            .collect::<io::Result<_>>()?;
        let mut total = 0;
        for client in clients {
            total += client.join().map_err(|_| io::Error::other("a client thread panicked"))??;
        }
        for server in servers {
            server.join().map_err(|_| io::Error::other("a server thread panicked"))??;
        }
        Ok(total)
    });
    let requests = answered?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(RequestLoopbackResult {
        connections: options.connections,
        requests,
        seconds,
        requests_per_sec: requests as f64 / seconds,
    })
}

/// One connection's client: a writer thread and this one reading; answers counted.
fn request_client(address: std::net::SocketAddr, options: &RequestLoopbackOptions) -> io::Result<u64> {
    let stream = TcpStream::connect_timeout(&address, LOOPBACK_STALL_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(LOOPBACK_STALL_TIMEOUT))?;
    stream.set_read_timeout(Some(LOOPBACK_STALL_TIMEOUT))?;
    let mut writing = stream.try_clone()?;
    // Requests sent and not yet answered; the writer waits while it is `in_flight`.
    let window = std::sync::Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let total = options.requests_per_connection;
    std::thread::scope(|scope| {
        let writer_window = window.clone();
        let writer = scope.spawn(move || -> io::Result<()> {
            let mut request = vec![0x5au8; options.request_bytes];
            request[..4].copy_from_slice(&(options.request_bytes as u32 - 4).to_le_bytes());
            let mut batch = Vec::with_capacity(options.request_bytes * options.in_flight);
            let mut sent = 0u64;
            while sent < total {
                let room = {
                    let (lock, changed) = &*writer_window;
                    let mut out = lock.lock().unwrap();
                    while *out >= options.in_flight {
                        let (next, timeout) = changed.wait_timeout(out, LOOPBACK_STALL_TIMEOUT).unwrap();
                        if timeout.timed_out() {
                            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer came"));
                        }
                        out = next;
                    }
                    let room = ((options.in_flight - *out) as u64).min(total - sent) as usize;
                    *out += room;
                    room
                };
                batch.clear();
                for _ in 0..room {
                    batch.extend_from_slice(&request);
                }
                writing.write_all(&batch)?;
                sent += room as u64;
            }
            Ok(())
        });
        let mut reading = &stream;
        let mut buffer = vec![0u8; 64 << 10];
        let (mut pending, mut answered) = (0usize, 0u64);
        while answered < total {
            let read = reading.read(&mut buffer)?;
            if read == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed"));
            }
            pending += read;
            let complete = pending / options.response_bytes;
            pending %= options.response_bytes;
            if complete > 0 {
                answered += complete as u64;
                let (lock, changed) = &*window;
                *lock.lock().unwrap() -= complete;
                changed.notify_one();
            }
        }
        writer.join().map_err(|_| io::Error::other("a writer thread panicked"))??;
        stream.shutdown(std::net::Shutdown::Write)?;
        Ok(answered)
    })
}

/// The server's side of one connection: answers every complete request, until the client
/// closes.
fn answer_requests(mut stream: TcpStream, response_bytes: usize) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(LOOPBACK_STALL_TIMEOUT))?;
    let mut response = vec![0u8; response_bytes];
    response[..4].copy_from_slice(&(response_bytes as u32 - 4).to_le_bytes());
    let mut buffer = vec![0u8; 256 << 10];
    let (mut start, mut end) = (0usize, 0usize);
    let mut answers = Vec::new();
    loop {
        if start == end {
            (start, end) = (0, 0);
        } else if end == buffer.len() {
            buffer.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        let read = stream.read(&mut buffer[end..])?;
        if read == 0 {
            return Ok(());
        }
        end += read;
        answers.clear();
        while end - start >= 4 {
            let length = u32::from_le_bytes(buffer[start..start + 4].try_into().unwrap()) as usize;
            if end - start < 4 + length {
                break;
            }
            start += 4 + length;
            answers.extend_from_slice(&response);
        }
        if !answers.is_empty() {
            stream.write_all(&answers)?;
        }
    }
}

/// The next connection, or a `TimedOut` error once `timeout` passed without one.
fn accept_within(listener: &TcpListener, timeout: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    let accepted = loop {
        match listener.accept() {
            Ok((stream, _)) => break Ok(stream),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    break Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no loopback connection arrived in {} s", timeout.as_secs_f64()),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(error) => break Err(error),
        }
    };
    listener.set_nonblocking(false)?;
    let stream = accepted?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_arrives() {
        let options =
            LoopbackOptions { bytes_per_connection: 3 * CHUNK_BYTES as u64 + 12_345, connections: 2 };
        let result = measure(&options).unwrap();
        assert_eq!(result.bytes, 2 * options.bytes_per_connection);
        assert!(result.mb_per_sec > 0.0);
    }

    #[test]
    fn every_request_is_answered_and_a_message_shorter_than_its_length_is_refused() {
        let options = RequestLoopbackOptions {
            requests_per_connection: 5_001,
            connections: 3,
            request_bytes: 1_100,
            response_bytes: 64,
            in_flight: 7,
        };
        let result = measure_requests(&options).unwrap();
        assert_eq!(result.requests, 3 * 5_001);
        assert!(result.requests_per_sec > 0.0);
        let refused = RequestLoopbackOptions { response_bytes: 3, ..options };
        assert_eq!(measure_requests(&refused).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn an_accept_that_gets_no_connection_gives_up() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let error = accept_within(&listener, Duration::from_millis(50)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn refuses_nothing_to_do() {
        let options = LoopbackOptions { bytes_per_connection: 0, connections: 1 };
        assert_eq!(measure(&options).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
