//! The monitoring endpoint from a test's side: a plain HTTP/1.1 GET, and a parser of the
//! OpenMetrics text format strict enough to fail on what Prometheus would refuse (a sample of
//! no declared family, a counter sample without `_total`, a malformed line, no `# EOF`).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `GET path` on `address`: the status code and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    http_request(address, "GET", path)
}

/// `method path` on `address`, `Connection: close`: the status code and the body.
pub fn http_request(address: &str, method: &str, path: &str) -> (u16, String) {
    let mut stream =
        TcpStream::connect(address).unwrap_or_else(|error| panic!("connecting to {address}: {error}"));
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) =
        response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head in {response:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A scrape, parsed.
#[derive(Debug, Default)]
pub struct Scrape {
    /// Each family's type, by family name.
    pub types: HashMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses OpenMetrics text; panics, naming the line, on anything it does not accept.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        let mut ended = false;
        for (number, line) in text.lines().enumerate() {
            let at = || format!("line {}: {line:?}", number + 1);
            assert!(!ended, "{}: text after # EOF", at());
            if line == "# EOF" {
                ended = true;
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (family, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{}", at()));
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "summary",
                        "info",
                        "stateset",
                        "unknown",
                        "gaugehistogram"
                    ]
                    .contains(&kind),
                    "{}: unknown type",
                    at()
                );
                assert!(
                    scrape.types.insert(family.to_owned(), kind.to_owned()).is_none(),
                    "{}: declared twice",
                    at()
                );
                continue;
            }
            if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
                continue;
            }
            assert!(!line.starts_with('#'), "{}: an unknown comment", at());
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{}", at()));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{}: not a number", at()));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, labels)) => {
                    let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{}", at()));
                    (name.to_owned(), parse_labels(labels).unwrap_or_else(|| panic!("{}: bad labels", at())))
                }
            };
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{}: a bad name",
                at()
            );
            let family = scrape.family_of(&name).unwrap_or_else(|| panic!("{}: no # TYPE declares it", at()));
            if scrape.types[&family] == "counter" {
                assert!(
                    name.ends_with("_total") || name.ends_with("_created"),
                    "{}: a counter without _total",
                    at()
                );
            }
            scrape.samples.push(Sample { name, labels, value });
        }
        assert!(ended, "the scrape does not end with # EOF");
        scrape
    }

    /// The declared family a sample's name belongs to.
    fn family_of(&self, name: &str) -> Option<String> {
        if self.types.contains_key(name) {
            return Some(name.to_owned());
        }
        ["_total", "_created", "_bucket", "_count", "_sum", "_info"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|family| self.types.contains_key(*family))
            .map(str::to_owned)
    }

    /// The type of `family`, if declared.
    pub fn type_of(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// The value of the sample `name` whose labels include every one of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|sample| {
                sample.name == name
                    && labels
                        .iter()
                        .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|sample| sample.value)
    }
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break index,
                c => value.push(c),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    Some(labels)
}
