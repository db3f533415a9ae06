//! An HTTP/1.1 receiver of push requests, for the tests of push subscriptions: it records
//! every request (when it came, its path, headers and body) and answers each as the test says.
//! Shared by the tests that push, so that each starts the same receiver.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A request a receiver read.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

type Answer = Arc<dyn Fn(&Seen, usize) -> (Duration, u16) + Send + Sync>;

/// An HTTP/1.1 receiver: records each request and answers it as `answer` says (after a delay,
/// with a status), given the request and how many came to its path before it.
pub struct Receiver {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    pub fn start(
        listener: TcpListener,
        answer: impl Fn(&Seen, usize) -> (Duration, u16) + Send + Sync + 'static,
    ) -> Receiver {
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answer: Answer = Arc::new(answer);
        let recorded = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (recorded, answer) = (recorded.clone(), answer.clone());
                std::thread::spawn(move || serve_connection(stream, &recorded, &answer));
            }
        });
        Receiver { port, seen }
    }

    pub fn on_free_port(
        answer: impl Fn(&Seen, usize) -> (Duration, u16) + Send + Sync + 'static,
    ) -> Receiver {
        Receiver::start(TcpListener::bind("127.0.0.1:0").unwrap(), answer)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn seen(&self, path: &str) -> Vec<Seen> {
        self.seen.lock().unwrap().iter().filter(|seen| seen.path == path).cloned().collect()
    }

    /// Waits up to `within` for `count` requests to `path`.
    pub fn wait_for(&self, path: &str, count: usize, within: Duration) -> Vec<Seen> {
        let until = Instant::now() + within;
        loop {
            let seen = self.seen(path);
            if seen.len() >= count || Instant::now() > until {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn serve_connection(stream: std::net::TcpStream, recorded: &Mutex<Vec<Seen>>, answer: &Answer) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let length = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .map_or(0, |(_, value)| value.parse().unwrap());
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let seen = Seen { at: Instant::now(), path, headers, body };
        let before = {
            let mut recorded = recorded.lock().unwrap();
            let before = recorded.iter().filter(|earlier| earlier.path == seen.path).count();
            recorded.push(seen.clone());
            before
        };
        let (delay, status) = answer(&seen, before);
        std::thread::sleep(delay);
        let reply = format!("HTTP/1.1 {status} Answer\r\ncontent-length: 0\r\n\r\n");
        if reader.get_mut().write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
