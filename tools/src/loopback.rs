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
