//! Subscription filters: Google Cloud Pub/Sub's filter language on message attributes.
//!
//! A subscription with a filter delivers only the messages whose attributes match it; the
//! others are acknowledged for the subscriber. The language, as Pub/Sub documents it:
//!
//! ```text
//! filter     := <empty> | expression
//! expression := unary (AND unary)* | unary (OR unary)*      -- AND and OR never mix unparenthesised
//! unary      := NOT unary | primary
//! primary    := '(' expression ')'
//!             | attributes '.' key ('=' | '!=') string
//!             | attributes ':' key
//!             | hasPrefix '(' attributes '.' key ',' string ')'
//! key        := name | string                               -- name: [A-Za-z_][A-Za-z0-9_-]*
//! string     := '"' (any character but '"' and '\', or the escapes \" and \\)* '"'
//! ```
//!
//! Keywords are case-sensitive. `attributes.KEY != "v"` also matches messages without KEY, as
//! in Pub/Sub. Parsing is a hand-written tokenizer and recursive descent; nesting is bounded by
//! [`FILTER_DEPTH_MAX`] so that neither parsing nor evaluation can exhaust the stack, and the
//! text by [`FILTER_BYTES_MAX`]. Every error names the byte position of the offending token.

use crate::api::limits::FILTER_BYTES_MAX;
use std::fmt;

/// Deepest nesting of parentheses and `NOT` a filter may have. Parsing and evaluation recurse
/// once per level, so this bound is what keeps a hostile filter from overflowing the stack.
pub const FILTER_DEPTH_MAX: usize = 32;

/// A parsed subscription filter. The empty filter matches every message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// `None` is the empty filter.
    expression: Option<Expression>,
}

/// A syntax error in a filter, at a byte offset of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    /// Byte offset of the offending token in the filter text; the text's length when the
    /// filter ends too early.
    pub position: usize,
    pub message: String,
}

impl fmt::Display for FilterError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "position {}: {}", self.position, self.message)
    }
}

impl std::error::Error for FilterError {}

impl Filter {
    /// Parses a filter. An empty (or all-whitespace) text is the filter that matches everything.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        if text.len() > FILTER_BYTES_MAX {
            // The first character that does not fit, so that the position is a character
            // boundary a caller can slice at.
            let mut position = FILTER_BYTES_MAX;
            while !text.is_char_boundary(position) {
                position -= 1;
            }
            return Err(FilterError {
                position,
                message: format!(
                    "the filter is {} bytes long; the limit is {FILTER_BYTES_MAX} bytes (FILTER_BYTES_MAX)",
                    text.len()
                ),
            });
        }
        parse_unbounded(text)
    }

    /// Whether a message with these attributes passes the filter. When a key appears more than
    /// once, its first value counts.
    pub fn matches<'a>(&self, attributes: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> bool {
        match &self.expression {
            None => true,
            Some(expression) => expression.evaluate(&attributes),
        }
    }

    /// True for the empty filter, which lets every message through without looking at it.
    pub fn matches_all(&self) -> bool {
        self.expression.is_none()
    }
}

/// The canonical text of the filter: it parses back to the same filter.
impl fmt::Display for Filter {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.expression {
            None => Ok(()),
            Some(expression) => fmt::Display::fmt(expression, formatter),
        }
    }
}

/// Parses without the length limit. The limit belongs to the public API; the canonical text of
/// a valid filter can be longer than its source (it adds spaces), and tests parse that text.
fn parse_unbounded(text: &str) -> Result<Filter, FilterError> {
    let mut lexer = Lexer { text, position: 0 };
    let current = lexer.next_token()?;
    let mut parser = Parser { lexer, current, depth: 0 };
    if parser.current.kind == TokenKind::End {
        return Ok(Filter { expression: None });
    }
    let expression = parser.parse_expression()?;
    if parser.current.kind != TokenKind::End {
        return Err(parser.trailing_token_error());
    }
    Ok(Filter { expression: Some(expression) })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expression {
    /// `attributes:KEY`
    HasKey(String),
    /// `attributes.KEY = "value"`
    Equal {
        key: String,
        value: String,
    },
    /// `attributes.KEY != "value"`, which also matches when KEY is absent.
    NotEqual {
        key: String,
        value: String,
    },
    /// `hasPrefix(attributes.KEY, "prefix")`
    HasPrefix {
        key: String,
        prefix: String,
    },
    Not(Box<Expression>),
    /// Two or more operands.
    And(Vec<Expression>),
    /// Two or more operands.
    Or(Vec<Expression>),
}

impl Expression {
    fn evaluate<'a, I>(&self, attributes: &I) -> bool
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        match self {
            Expression::HasKey(key) => lookup(attributes, key).is_some(),
            Expression::Equal { key, value } => lookup(attributes, key) == Some(value.as_str()),
            Expression::NotEqual { key, value } => lookup(attributes, key) != Some(value.as_str()),
            Expression::HasPrefix { key, prefix } => {
                lookup(attributes, key).is_some_and(|value| value.starts_with(prefix.as_str()))
            }
            Expression::Not(operand) => !operand.evaluate(attributes),
            Expression::And(operands) => operands.iter().all(|operand| operand.evaluate(attributes)),
            Expression::Or(operands) => operands.iter().any(|operand| operand.evaluate(attributes)),
        }
    }

    /// Writes an operand of NOT, AND or OR, in parentheses when it is itself an AND or OR: the
    /// language requires them when mixing, and they keep the grouping when not.
    fn fmt_operand(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expression::And(_) | Expression::Or(_) => write!(formatter, "({self})"),
            _ => fmt::Display::fmt(self, formatter),
        }
    }
}

impl fmt::Display for Expression {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expression::HasKey(key) => write!(formatter, "attributes:{}", KeyText(key)),
            Expression::Equal { key, value } => {
                write!(formatter, "attributes.{} = {}", KeyText(key), StringLiteral(value))
            }
            Expression::NotEqual { key, value } => {
                write!(formatter, "attributes.{} != {}", KeyText(key), StringLiteral(value))
            }
            Expression::HasPrefix { key, prefix } => {
                write!(formatter, "hasPrefix(attributes.{}, {})", KeyText(key), StringLiteral(prefix))
            }
            Expression::Not(operand) => {
                formatter.write_str("NOT ")?;
                operand.fmt_operand(formatter)
            }
            Expression::And(operands) | Expression::Or(operands) => {
                let keyword = if matches!(self, Expression::And(_)) { " AND " } else { " OR " };
                for (index, operand) in operands.iter().enumerate() {
                    if index > 0 {
                        formatter.write_str(keyword)?;
                    }
                    operand.fmt_operand(formatter)?;
                }
                Ok(())
            }
        }
    }
}

fn lookup<'a, I>(attributes: &I, key: &str) -> Option<&'a str>
where
    I: Iterator<Item = (&'a str, &'a str)> + Clone,
{
    attributes.clone().find(|(candidate, _)| *candidate == key).map(|(_, value)| value)
}

/// A string as a filter literal, in double quotes with `"` and `\` escaped.
struct StringLiteral<'s>(&'s str);

impl fmt::Display for StringLiteral<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("\"")?;
        for character in self.0.chars() {
            if character == '"' || character == '\\' {
                formatter.write_str("\\")?;
            }
            write!(formatter, "{character}")?;
        }
        formatter.write_str("\"")
    }
}

/// An attribute key as written after `attributes.`: bare when it is a name, quoted otherwise.
struct KeyText<'s>(&'s str);

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_bare_key(self.0) {
            formatter.write_str(self.0)
        } else {
            fmt::Display::fmt(&StringLiteral(self.0), formatter)
        }
    }
}

/// Word characters: Pub/Sub lets unquoted keys hold letters, digits, `_` and `-`
/// (CloudEvents attributes such as `ce-type` rely on the hyphen).
fn is_word_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-'
}

fn is_bare_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    !bytes.is_empty()
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes.iter().all(|byte| is_word_byte(*byte))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TokenKind<'t> {
    /// Keywords, `attributes`, `hasPrefix` and bare keys alike: the parser tells them apart by
    /// where they stand, so a key may be spelled like a keyword (`attributes.NOT`).
    Word(&'t str),
    /// A string literal, with its escapes resolved.
    String(String),
    Dot,
    Colon,
    Comma,
    Equal,
    NotEqual,
    LeftParenthesis,
    RightParenthesis,
    End,
}

#[derive(Debug, Clone)]
struct Token<'t> {
    kind: TokenKind<'t>,
    position: usize,
}

/// What the user wrote, for "found ..." in error messages.
fn describe(kind: &TokenKind<'_>) -> String {
    match kind {
        TokenKind::Word(word) => format!("'{word}'"),
        TokenKind::String(value) => format!("the string {}", StringLiteral(value)),
        TokenKind::Dot => "'.'".to_string(),
        TokenKind::Colon => "':'".to_string(),
        TokenKind::Comma => "','".to_string(),
        TokenKind::Equal => "'='".to_string(),
        TokenKind::NotEqual => "'!='".to_string(),
        TokenKind::LeftParenthesis => "'('".to_string(),
        TokenKind::RightParenthesis => "')'".to_string(),
        TokenKind::End => "the end of the filter".to_string(),
    }
}

/// A hint for a keyword written in the wrong case, which is the most likely slip.
fn keyword_case_hint(word: &str) -> Option<String> {
    ["AND", "OR", "NOT", "attributes", "hasPrefix"]
        .into_iter()
        .find(|keyword| word != *keyword && word.eq_ignore_ascii_case(keyword))
        .map(|keyword| format!("keywords are case-sensitive: write {keyword}"))
}

fn error(position: usize, message: impl Into<String>) -> FilterError {
    FilterError { position, message: message.into() }
}

/// Produces tokens on demand, so that the first error in the text is the one reported even
/// when a later part would not tokenize.
struct Lexer<'t> {
    text: &'t str,
    position: usize,
}

impl<'t> Lexer<'t> {
    fn next_token(&mut self) -> Result<Token<'t>, FilterError> {
        let bytes = self.text.as_bytes();
        while bytes.get(self.position).is_some_and(|byte| byte.is_ascii_whitespace()) {
            self.position += 1;
        }
        let start = self.position;
        let Some(&byte) = bytes.get(start) else {
            return Ok(Token { kind: TokenKind::End, position: start });
        };
        let next = bytes.get(start + 1).copied();
        let (kind, length) = match byte {
            b'.' => (TokenKind::Dot, 1),
            b':' => (TokenKind::Colon, 1),
            b',' => (TokenKind::Comma, 1),
            b'(' => (TokenKind::LeftParenthesis, 1),
            b')' => (TokenKind::RightParenthesis, 1),
            b'=' if next == Some(b'=') => return Err(error(start, "'==' is not an operator; write '='")),
            b'=' => (TokenKind::Equal, 1),
            b'!' if next == Some(b'=') => (TokenKind::NotEqual, 2),
            b'!' => {
                return Err(error(
                    start,
                    "'!' alone is not an operator; write NOT to negate, or '!=' to compare",
                ))
            }
            b'"' => return self.string(start),
            b'-' => {
                return Err(error(
                    start,
                    "unexpected '-': write NOT to negate, and quote keys that start with '-'",
                ))
            }
            b'\'' => return Err(error(start, "strings are written in double quotes, not single quotes")),
            b'&' => return Err(error(start, "'&' is not an operator; write AND")),
            b'|' => return Err(error(start, "'|' is not an operator; write OR")),
            byte if is_word_byte(byte) => {
                let length = bytes[start..].iter().take_while(|byte| is_word_byte(**byte)).count();
                (TokenKind::Word(&self.text[start..start + length]), length)
            }
            _ => {
                let character = self.text[start..].chars().next().unwrap_or_default();
                return Err(error(start, format!("unexpected character '{character}'")));
            }
        };
        self.position = start + length;
        Ok(Token { kind, position: start })
    }

    /// Reads a string literal whose opening quote is at `start`.
    fn string(&mut self, start: usize) -> Result<Token<'t>, FilterError> {
        let bytes = self.text.as_bytes();
        let unterminated = || error(start, "this string has no closing '\"'");
        let mut value = String::new();
        // Unescaped runs are copied whole; they begin and end at ASCII bytes, so at character
        // boundaries.
        let mut run_start = start + 1;
        let mut index = start + 1;
        loop {
            match bytes.get(index) {
                None => return Err(unterminated()),
                Some(b'"') => {
                    value.push_str(&self.text[run_start..index]);
                    self.position = index + 1;
                    return Ok(Token { kind: TokenKind::String(value), position: start });
                }
                Some(b'\\') => {
                    value.push_str(&self.text[run_start..index]);
                    match bytes.get(index + 1) {
                        None => return Err(unterminated()),
                        Some(b'"') => value.push('"'),
                        Some(b'\\') => value.push('\\'),
                        Some(_) => {
                            let character = self.text[index + 1..].chars().next().unwrap_or_default();
                            return Err(error(
                                index,
                                format!("unsupported escape '\\{character}'; strings support \\\" and \\\\"),
                            ));
                        }
                    }
                    index += 2;
                    run_start = index;
                }
                Some(_) => index += 1,
            }
        }
    }
}

/// Recursive descent with one token of lookahead in `current`.
struct Parser<'t> {
    lexer: Lexer<'t>,
    current: Token<'t>,
    /// Parentheses and NOTs open around the current token.
    depth: usize,
}

impl<'t> Parser<'t> {
    /// Consumes the current token and returns it.
    fn advance(&mut self) -> Result<Token<'t>, FilterError> {
        let next = self.lexer.next_token()?;
        Ok(std::mem::replace(&mut self.current, next))
    }

    fn found(&self) -> String {
        describe(&self.current.kind)
    }

    /// A hint when the current token is a keyword in the wrong case.
    fn case_hint(&self) -> Option<String> {
        match self.current.kind {
            TokenKind::Word(word) => keyword_case_hint(word),
            _ => None,
        }
    }

    fn is_word(&self, word: &str) -> bool {
        self.current.kind == TokenKind::Word(word)
    }

    /// Consumes a punctuation token, or fails with `message` plus what was found.
    fn expect(&mut self, kind: TokenKind<'static>, message: &str) -> Result<(), FilterError> {
        if self.current.kind != kind {
            return Err(error(self.current.position, format!("{message}, found {}", self.found())));
        }
        self.advance()?;
        Ok(())
    }

    fn enter(&mut self, position: usize) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > FILTER_DEPTH_MAX {
            return Err(error(
                position,
                format!(
                    "the filter nests deeper than {FILTER_DEPTH_MAX} levels of parentheses and NOT \
                     (FILTER_DEPTH_MAX)"
                ),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    fn parse_expression(&mut self) -> Result<Expression, FilterError> {
        let mut operands = vec![self.parse_unary()?];
        let mut chain_keyword: Option<&'static str> = None;
        loop {
            let keyword = if self.is_word("AND") {
                "AND"
            } else if self.is_word("OR") {
                "OR"
            } else {
                break;
            };
            // Pub/Sub gives AND and OR no relative precedence: mixing them needs parentheses.
            if chain_keyword.is_some_and(|chain| chain != keyword) {
                return Err(error(
                    self.current.position,
                    "use parentheses to group AND and OR: they cannot be mixed at the same level",
                ));
            }
            chain_keyword = Some(keyword);
            self.advance()?;
            operands.push(self.parse_unary()?);
        }
        Ok(match chain_keyword {
            None => operands.pop().expect("one operand was parsed"),
            Some("AND") => Expression::And(operands),
            Some(_) => Expression::Or(operands),
        })
    }

    fn parse_unary(&mut self) -> Result<Expression, FilterError> {
        if !self.is_word("NOT") {
            return self.parse_primary();
        }
        self.enter(self.current.position)?;
        self.advance()?;
        let operand = self.parse_unary()?;
        self.leave();
        Ok(Expression::Not(Box::new(operand)))
    }

    fn parse_primary(&mut self) -> Result<Expression, FilterError> {
        let position = self.current.position;
        match &self.current.kind {
            TokenKind::LeftParenthesis => {
                self.enter(position)?;
                self.advance()?;
                let expression = self.parse_expression()?;
                if self.current.kind != TokenKind::RightParenthesis {
                    let hint = self.case_hint().map(|hint| format!("; {hint}"));
                    return Err(error(
                        self.current.position,
                        format!(
                            "expected ')' to close the '(' at position {position}, found {}{}",
                            self.found(),
                            hint.unwrap_or_default()
                        ),
                    ));
                }
                self.advance()?;
                self.leave();
                Ok(expression)
            }
            TokenKind::Word("attributes") => self.parse_attribute_condition(),
            TokenKind::Word("hasPrefix") => self.parse_has_prefix(),
            TokenKind::Word(word) if *word != "AND" && *word != "OR" => {
                let hint = keyword_case_hint(word).unwrap_or_else(|| {
                    "filters start with attributes.KEY, attributes:KEY, hasPrefix(...) or NOT".to_string()
                });
                Err(error(position, format!("unknown identifier '{word}'; {hint}")))
            }
            _ => Err(error(
                position,
                format!(
                    "expected a condition (attributes.KEY, attributes:KEY, hasPrefix(...), NOT or '('), \
                     found {}",
                    self.found()
                ),
            )),
        }
    }

    /// `attributes.KEY = "v"`, `attributes.KEY != "v"` or `attributes:KEY`, at `attributes`.
    fn parse_attribute_condition(&mut self) -> Result<Expression, FilterError> {
        self.advance()?;
        match self.current.kind {
            TokenKind::Colon => {
                self.advance()?;
                Ok(Expression::HasKey(self.parse_key("attributes:")?))
            }
            TokenKind::Dot => {
                self.advance()?;
                let key = self.parse_key("attributes.")?;
                let negated = match self.current.kind {
                    TokenKind::Equal => false,
                    TokenKind::NotEqual => true,
                    _ => {
                        return Err(error(
                            self.current.position,
                            format!(
                                "expected '=' or '!=' after attributes.{}, found {}",
                                KeyText(&key),
                                self.found()
                            ),
                        ))
                    }
                };
                let operator = if negated { "!=" } else { "=" };
                self.advance()?;
                let value = self.parse_string(&format!("after '{operator}'"))?;
                Ok(if negated {
                    Expression::NotEqual { key, value }
                } else {
                    Expression::Equal { key, value }
                })
            }
            _ => Err(error(
                self.current.position,
                format!(
                    "expected '.' or ':' after 'attributes' (attributes.KEY or attributes:KEY), found {}",
                    self.found()
                ),
            )),
        }
    }

    /// `hasPrefix(attributes.KEY, "prefix")`, at `hasPrefix`.
    fn parse_has_prefix(&mut self) -> Result<Expression, FilterError> {
        self.advance()?;
        self.expect(TokenKind::LeftParenthesis, "expected '(' after hasPrefix")?;
        if !self.is_word("attributes") {
            return Err(error(
                self.current.position,
                format!("hasPrefix takes attributes.KEY as its first argument, found {}", self.found()),
            ));
        }
        self.advance()?;
        self.expect(TokenKind::Dot, "hasPrefix takes attributes.KEY as its first argument: expected '.'")?;
        let key = self.parse_key("attributes.")?;
        let message = format!(
            "hasPrefix takes two arguments: expected ',' and a prefix string after attributes.{}",
            KeyText(&key)
        );
        self.expect(TokenKind::Comma, &message)?;
        let prefix = self.parse_string("as the second argument of hasPrefix")?;
        self.expect(TokenKind::RightParenthesis, "expected ')' to close hasPrefix(...)")?;
        Ok(Expression::HasPrefix { key, prefix })
    }

    /// An attribute key after `introducer` (`attributes.` or `attributes:`).
    fn parse_key(&mut self, introducer: &str) -> Result<String, FilterError> {
        let position = self.current.position;
        let key = match &self.current.kind {
            TokenKind::Word(word) if is_bare_key(word) => word.to_string(),
            TokenKind::Word(word) => {
                return Err(error(
                    position,
                    format!(
                        "attribute key '{word}' must start with a letter or '_'; quote it: {introducer}{}",
                        StringLiteral(word)
                    ),
                ))
            }
            TokenKind::String(key) if key.is_empty() => {
                return Err(error(position, "an attribute key cannot be empty"))
            }
            TokenKind::String(key) => key.clone(),
            _ => {
                return Err(error(
                    position,
                    format!(
                        "expected an attribute key after '{introducer}' (a name such as region, or a \
                         quoted string), found {}",
                        self.found()
                    ),
                ))
            }
        };
        self.advance()?;
        Ok(key)
    }

    /// A string literal, described as standing `place` in error messages.
    fn parse_string(&mut self, place: &str) -> Result<String, FilterError> {
        let TokenKind::String(value) = &self.current.kind else {
            return Err(error(
                self.current.position,
                format!("expected a string in double quotes {place}, found {}", self.found()),
            ));
        };
        let value = value.clone();
        self.advance()?;
        Ok(value)
    }

    /// The error for a token left over after a complete top-level expression.
    fn trailing_token_error(&self) -> FilterError {
        let message = match (&self.current.kind, self.case_hint()) {
            (TokenKind::RightParenthesis, _) => "unmatched ')'".to_string(),
            (_, Some(hint)) => format!("unexpected {} after a complete condition; {hint}", self.found()),
            _ => format!(
                "unexpected {} after a complete condition; join conditions with AND or OR",
                self.found()
            ),
        };
        error(self.current.position, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn matches(filter: &str, attributes: &[(&str, &str)]) -> bool {
        Filter::parse(filter)
            .unwrap_or_else(|error| panic!("{filter}: {error}"))
            .matches(attributes.iter().copied())
    }

    fn parse_error(filter: &str) -> FilterError {
        match Filter::parse(filter) {
            Ok(parsed) => panic!("{filter} parsed as {parsed:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn empty_filter_matches_everything() {
        for text in ["", " ", "\t\n "] {
            let filter = Filter::parse(text).unwrap();
            assert!(filter.matches_all());
            assert!(filter.matches(std::iter::empty()));
            assert!(filter.matches([("a", "1")].into_iter()));
            assert_eq!(filter.to_string(), "");
        }
        assert!(!Filter::parse("attributes:a").unwrap().matches_all());
    }

    #[test]
    fn equal_requires_presence_and_equality() {
        let filter = r#"attributes.region = "eu""#;
        assert!(matches(filter, &[("region", "eu")]));
        assert!(matches(filter, &[("other", "x"), ("region", "eu")]));
        assert!(!matches(filter, &[("region", "us")]));
        assert!(!matches(filter, &[("region", "eu-west")]));
        assert!(!matches(filter, &[("region", "EU")]));
        assert!(!matches(filter, &[("Region", "eu")]));
        assert!(!matches(filter, &[]));
        assert!(matches(r#"attributes.empty = """#, &[("empty", "")]));
        assert!(!matches(r#"attributes.empty = """#, &[]));
    }

    #[test]
    fn not_equal_also_matches_an_absent_key() {
        let filter = r#"attributes.region != "eu""#;
        assert!(matches(filter, &[]));
        assert!(matches(filter, &[("other", "eu")]));
        assert!(matches(filter, &[("region", "us")]));
        assert!(!matches(filter, &[("region", "eu")]));
    }

    #[test]
    fn has_key_matches_presence_whatever_the_value() {
        assert!(matches("attributes:region", &[("region", "")]));
        assert!(matches("attributes:region", &[("region", "eu")]));
        assert!(!matches("attributes:region", &[("regions", "eu")]));
        assert!(!matches("attributes:region", &[]));
    }

    #[test]
    fn has_prefix_requires_presence_and_the_prefix() {
        let filter = r#"hasPrefix(attributes.region, "eu-")"#;
        assert!(matches(filter, &[("region", "eu-west")]));
        assert!(matches(filter, &[("region", "eu-")]));
        assert!(!matches(filter, &[("region", "eu")]));
        assert!(!matches(filter, &[("region", "us-eu-")]));
        assert!(!matches(filter, &[]));
        assert!(matches(r#"hasPrefix(attributes.region, "")"#, &[("region", "")]));
        assert!(!matches(r#"hasPrefix(attributes.region, "")"#, &[]));
    }

    #[test]
    fn the_first_value_of_a_repeated_key_counts() {
        assert!(matches(r#"attributes.k = "1""#, &[("k", "1"), ("k", "2")]));
        assert!(!matches(r#"attributes.k = "2""#, &[("k", "1"), ("k", "2")]));
    }

    #[test]
    fn not_negates() {
        assert!(matches("NOT attributes:a", &[]));
        assert!(!matches("NOT attributes:a", &[("a", "")]));
        assert!(matches("NOT NOT attributes:a", &[("a", "")]));
        assert!(matches(r#"NOT hasPrefix(attributes.a, "x")"#, &[("a", "yx")]));
        assert!(!matches(r#"NOT attributes.a = "1""#, &[("a", "1")]));
        assert!(matches(r#"NOT attributes.a = "1""#, &[]));
    }

    #[test]
    fn not_binds_tighter_than_and_and_or() {
        // NOT a AND b is (NOT a) AND b: with a and b absent, (NOT a) AND b is false while
        // NOT (a AND b) would be true.
        assert!(!matches("NOT attributes:a AND attributes:b", &[]));
        assert!(matches("NOT (attributes:a AND attributes:b)", &[]));
        // NOT a OR b is (NOT a) OR b: with a and b present, (NOT a) OR b is true while
        // NOT (a OR b) would be false.
        assert!(matches("NOT attributes:a OR attributes:b", &[("a", ""), ("b", "")]));
        assert!(!matches("NOT (attributes:a OR attributes:b)", &[("a", ""), ("b", "")]));
        assert_eq!(
            Filter::parse("NOT attributes:a AND attributes:b").unwrap(),
            Filter::parse("(NOT attributes:a) AND attributes:b").unwrap()
        );
    }

    #[test]
    fn and_and_or_chains() {
        let and = "attributes:a AND attributes:b AND attributes:c";
        assert!(matches(and, &[("a", ""), ("b", ""), ("c", "")]));
        assert!(!matches(and, &[("a", ""), ("c", "")]));
        let or = "attributes:a OR attributes:b OR attributes:c";
        assert!(matches(or, &[("c", "")]));
        assert!(!matches(or, &[("d", "")]));
    }

    #[test]
    fn parentheses_group() {
        let filter = "(attributes:a OR attributes:b) AND attributes:c";
        assert!(matches(filter, &[("b", ""), ("c", "")]));
        assert!(!matches(filter, &[("a", ""), ("b", "")]));
        let filter = "attributes:a OR (attributes:b AND attributes:c)";
        assert!(matches(filter, &[("a", "")]));
        assert!(!matches(filter, &[("b", "")]));
        assert!(matches("((attributes:a))", &[("a", "")]));
        assert!(matches("NOT (NOT (attributes:a))", &[("a", "")]));
    }

    #[test]
    fn and_and_or_need_parentheses_to_mix() {
        for (text, position) in [
            ("attributes:a AND attributes:b OR attributes:c", 30),
            ("attributes:a OR attributes:b AND attributes:c", 29),
            ("NOT attributes:a AND attributes:b OR attributes:c", 34),
            ("(attributes:a AND attributes:b OR attributes:c)", 31),
        ] {
            let error = parse_error(text);
            assert_eq!(error.position, position, "{text}: {error}");
            assert!(error.message.contains("use parentheses to group AND and OR"), "{error}");
        }
        Filter::parse("(attributes:a AND attributes:b) OR attributes:c").unwrap();
        Filter::parse("attributes:a AND (attributes:b OR attributes:c) AND attributes:d").unwrap();
    }

    #[test]
    fn keywords_are_case_sensitive() {
        let error = parse_error("attributes:a and attributes:b");
        assert_eq!(error.position, 13);
        assert!(error.message.contains("write AND"), "{error}");
        let error = parse_error("not attributes:a");
        assert_eq!((error.position, error.message.contains("write NOT")), (0, true), "{error}");
        let error = parse_error("(attributes:a or attributes:b)");
        assert_eq!((error.position, error.message.contains("write OR")), (14, true), "{error}");
        let error = parse_error(r#"hasprefix(attributes.a, "x")"#);
        assert!(error.message.contains("write hasPrefix"), "{error}");
        let error = parse_error("Attributes:a");
        assert!(error.message.contains("write attributes"), "{error}");
    }

    #[test]
    fn quoted_keys_and_escapes() {
        assert!(matches(r#"attributes."a key" = "v""#, &[("a key", "v")]));
        assert!(matches(r#"attributes:"iana.org/language_tag""#, &[("iana.org/language_tag", "en")]));
        assert!(matches(r#"hasPrefix(attributes."x.y", "p")"#, &[("x.y", "pq")]));
        assert!(matches(r#"attributes."1st" = "v""#, &[("1st", "v")]));
        assert!(matches(r#"attributes.k = "say \"hi\"""#, &[("k", r#"say "hi""#)]));
        assert!(matches(r#"attributes.k = "back\\slash""#, &[("k", r"back\slash")]));
        assert!(matches(r#"attributes."q\"k" = "\\""#, &[("q\"k", "\\")]));
        assert!(matches(r#"attributes.k = "é ✓""#, &[("k", "é ✓")]));
        // Keywords are ordinary keys after `attributes.`.
        assert!(matches(r#"attributes.NOT = "AND""#, &[("NOT", "AND")]));
        // Pub/Sub lets unquoted keys hold hyphens, as CloudEvents attributes do.
        assert!(matches(
            r#"attributes.ce-type = "x" AND attributes:ce-source"#,
            &[("ce-type", "x"), ("ce-source", "")]
        ));
    }

    #[test]
    fn whitespace_is_free_between_tokens() {
        let attributes = [("a", "1"), ("b", "2")];
        for text in [
            r#"attributes.a="1" AND attributes:b"#,
            r#"  attributes . a  =  "1"   AND   attributes : b  "#,
            "attributes.a\t=\n\"1\"\r\nAND\tattributes:b",
            r#"(attributes.a="1")AND(attributes:b)"#,
            r#"NOT(attributes.a!="1")AND hasPrefix( attributes.b ,"2" )"#,
        ] {
            assert!(matches(text, &attributes), "{text}");
        }
        // A keyword needs a space before a word, or it reads as one longer word.
        let error = parse_error("NOTattributes:a");
        assert!(error.message.contains("unknown identifier 'NOTattributes'"), "{error}");
    }

    #[test]
    fn display_is_canonical_and_parses_back() {
        for (text, canonical) in [
            (r#"attributes.a="1""#, r#"attributes.a = "1""#),
            ("attributes : a", "attributes:a"),
            (r#"hasPrefix(attributes."a b","\"")"#, r#"hasPrefix(attributes."a b", "\"")"#),
            ("NOT(attributes:a AND attributes:b)", "NOT (attributes:a AND attributes:b)"),
            (
                "(attributes:a OR attributes:b) AND NOT attributes:c",
                "(attributes:a OR attributes:b) AND NOT attributes:c",
            ),
        ] {
            let filter = Filter::parse(text).unwrap();
            assert_eq!(filter.to_string(), canonical);
            assert_eq!(Filter::parse(canonical).unwrap(), filter);
        }
    }

    #[test]
    fn errors_name_the_offending_position() {
        for (text, position, message) in [
            (r#"attributes.k = "abc"#, 15, "has no closing '\"'"),
            (r#"attributes.k = "abc\"#, 15, "has no closing '\"'"),
            ("attributes.k =", 14, "expected a string in double quotes after '=', found the end"),
            ("attributes.k = value", 15, "expected a string in double quotes after '=', found 'value'"),
            (r#"attributes.k != 5"#, 16, "expected a string in double quotes after '!='"),
            (r#"attributes.k = "v" attributes:j"#, 19, "unexpected 'attributes' after a complete condition"),
            (r#"attributes.k = "v")"#, 18, "unmatched ')'"),
            ("attributes.", 11, "expected an attribute key after 'attributes.'"),
            ("attributes", 10, "expected '.' or ':' after 'attributes'"),
            ("attributes:", 11, "expected an attribute key after 'attributes:'"),
            (r#"attributes.region "eu""#, 18, "expected '=' or '!=' after attributes.region"),
            ("hasPrefix(attributes.k)", 22, "hasPrefix takes two arguments"),
            (r#"hasPrefix(attributes.k, "p""#, 27, "expected ')' to close hasPrefix"),
            (r#"hasPrefix attributes.k, "p")"#, 10, "expected '(' after hasPrefix"),
            (r#"hasPrefix(attributes:k, "p")"#, 20, "hasPrefix takes attributes.KEY"),
            (r#"hasPrefix("k", "p")"#, 10, "hasPrefix takes attributes.KEY as its first argument"),
            (r#"attribute.k = "v""#, 0, "unknown identifier 'attribute'; filters start with"),
            ("(attributes:a", 13, "expected ')' to close the '(' at position 0"),
            ("()", 1, "expected a condition"),
            ("NOT", 3, "expected a condition"),
            ("attributes:a AND", 16, "expected a condition"),
            ("AND attributes:a", 0, "expected a condition"),
            (r#"attributes.k == "v""#, 13, "'==' is not an operator"),
            (r#"attributes.k = 'v'"#, 15, "double quotes"),
            ("-attributes:a", 0, "write NOT"),
            ("!attributes:a", 0, "write NOT"),
            ("attributes:a && attributes:b", 13, "write AND"),
            ("attributes:a || attributes:b", 13, "write OR"),
            (r#"attributes.k = "a\nb""#, 17, r"unsupported escape '\n'"),
            (r#"attributes."" = "v""#, 11, "cannot be empty"),
            (r#"attributes.1k = "v""#, 11, "must start with a letter"),
            ("attributes:a # b", 13, "unexpected character '#'"),
            ("attributes:a AND é", 17, "unexpected character 'é'"),
        ] {
            let error = parse_error(text);
            assert_eq!(error.position, position, "{text}: {error}");
            assert!(error.message.contains(message), "{text}: {error}");
        }
    }

    #[test]
    fn error_display_puts_the_position_first() {
        let error = parse_error(r#"attributes.region "eu""#);
        assert_eq!(
            error.to_string(),
            "position 18: expected '=' or '!=' after attributes.region, found the string \"eu\""
        );
        let error = parse_error(r#"attribute.k = "v""#);
        assert_eq!(
            error.to_string(),
            "position 0: unknown identifier 'attribute'; filters start with attributes.KEY, attributes:KEY, \
             hasPrefix(...) or NOT"
        );
    }

    #[test]
    fn the_length_limit_is_filter_bytes_max() {
        let longest = format!(r#"attributes.k = "{}""#, "x".repeat(FILTER_BYTES_MAX - 17));
        assert_eq!(longest.len(), FILTER_BYTES_MAX);
        assert!(matches(&longest, &[("k", &"x".repeat(FILTER_BYTES_MAX - 17))]));
        let too_long = format!(r#"attributes.k = "{}""#, "x".repeat(FILTER_BYTES_MAX - 16));
        assert_eq!(too_long.len(), 257);
        let error = parse_error(&too_long);
        assert_eq!(error.position, FILTER_BYTES_MAX);
        assert!(error.message.contains("257 bytes"), "{error}");
        // The limit counts bytes, not characters, and the position stays on a character
        // boundary: here a two-byte 'é' straddles byte 256.
        let straddling = format!(r#"attributes.k = "{}é""#, "x".repeat(FILTER_BYTES_MAX - 17));
        assert_eq!((straddling.len(), &straddling[FILTER_BYTES_MAX - 1..FILTER_BYTES_MAX + 1]), (258, "é"));
        assert_eq!(parse_error(&straddling).position, FILTER_BYTES_MAX - 1);
    }

    #[test]
    fn nesting_is_bounded_by_filter_depth_max() {
        let nested = |levels: usize| format!("{}attributes:a{}", "(".repeat(levels), ")".repeat(levels));
        assert!(matches(&nested(FILTER_DEPTH_MAX), &[("a", "")]));
        let error = parse_error(&nested(40));
        assert_eq!(error.position, FILTER_DEPTH_MAX, "{error}");
        assert!(error.message.contains("deeper than 32"), "{error}");

        let negated = |levels: usize| format!("{}attributes:a", "NOT ".repeat(levels));
        assert!(matches(&negated(FILTER_DEPTH_MAX), &[("a", "")]));
        let error = parse_error(&negated(40));
        assert_eq!(error.position, 4 * FILTER_DEPTH_MAX, "{error}");

        // Parentheses and NOT count together.
        let mixed = format!("{}attributes:a{}", "NOT (".repeat(17), ")".repeat(17));
        // Level 33 is the seventeenth NOT.
        assert_eq!(parse_error(&mixed).position, 16 * 5);
        // Long flat chains are not nesting. No chain of 40 conditions fits in FILTER_BYTES_MAX,
        // so this one is parsed without the length limit.
        let chain = vec!["attributes:a"; 40].join(" AND ");
        let filter = parse_unbounded(&chain).unwrap();
        assert!(filter.matches([("a", "")].into_iter()));
    }

    /// Pieces of filter syntax, so that random strings reach deep into the parser.
    const FRAGMENTS: &[&str] = &[
        "attributes",
        ".",
        ":",
        "\"",
        "\\",
        "(",
        ")",
        ",",
        "=",
        "!=",
        "!",
        " ",
        "AND",
        "OR",
        "NOT",
        "hasPrefix",
        "k",
        "-",
        "é",
        "\"v\"",
        "and",
        "1",
    ];

    fn check_never_panics(text: &str) {
        match Filter::parse(text) {
            Ok(filter) => {
                let _ = filter.matches([("k", "v"), ("a", "")].into_iter());
                // Whatever parses must print to text that parses back to the same filter.
                assert_eq!(parse_unbounded(&filter.to_string()), Ok(filter));
            }
            Err(error) => {
                assert!(error.position <= text.len(), "{text:?}: {error}");
                assert!(text.is_char_boundary(error.position), "{text:?}: {error}");
            }
        }
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b_1", "ce-type", "has space", "quote\"d", "back\\slash", "NOT", "é"])
            .prop_map(str::to_string)
    }

    fn value_strategy() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["", "x", "xy", "xyz", "a\"b", "\\", "é"]).prop_map(str::to_string)
    }

    fn expression_strategy() -> impl Strategy<Value = Expression> {
        let leaf = prop_oneof![
            key_strategy().prop_map(Expression::HasKey),
            (key_strategy(), value_strategy()).prop_map(|(key, value)| Expression::Equal { key, value }),
            (key_strategy(), value_strategy()).prop_map(|(key, value)| Expression::NotEqual { key, value }),
            (key_strategy(), value_strategy())
                .prop_map(|(key, prefix)| Expression::HasPrefix { key, prefix }),
        ];
        leaf.prop_recursive(5, 32, 4, |inner| {
            prop_oneof![
                inner.clone().prop_map(|operand| Expression::Not(Box::new(operand))),
                prop::collection::vec(inner.clone(), 2..4).prop_map(Expression::And),
                prop::collection::vec(inner, 2..4).prop_map(Expression::Or),
            ]
        })
    }

    /// The semantics written out plainly, over a map, to check `matches` against.
    fn model(expression: &Expression, attributes: &BTreeMap<String, String>) -> bool {
        match expression {
            Expression::HasKey(key) => attributes.contains_key(key),
            Expression::Equal { key, value } => attributes.get(key) == Some(value),
            Expression::NotEqual { key, value } => attributes.get(key) != Some(value),
            Expression::HasPrefix { key, prefix } => {
                attributes.get(key).is_some_and(|value| value.starts_with(prefix.as_str()))
            }
            Expression::Not(operand) => !model(operand, attributes),
            Expression::And(operands) => operands.iter().all(|operand| model(operand, attributes)),
            Expression::Or(operands) => operands.iter().any(|operand| model(operand, attributes)),
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_text(characters in prop::collection::vec(any::<char>(), 0..300)) {
            let mut text: String = characters.into_iter().collect();
            while text.len() > 300 {
                text.pop();
            }
            check_never_panics(&text);
        }

        #[test]
        fn parse_never_panics_on_filter_like_text(
            pieces in prop::collection::vec(prop::sample::select(FRAGMENTS), 0..60)
        ) {
            let mut text = pieces.concat();
            while text.len() > 300 {
                text.pop();
            }
            check_never_panics(&text);
        }

        #[test]
        fn printed_filters_parse_back_and_evaluate_alike(
            expression in expression_strategy(),
            attributes in prop::collection::btree_map(key_strategy(), value_strategy(), 0..6),
        ) {
            let text = expression.to_string();
            let parsed = parse_unbounded(&text).map_err(|error| TestCaseError::fail(format!("{text}: {error}")))?;
            prop_assert_eq!(&parsed, &Filter { expression: Some(expression.clone()) });
            if text.len() <= FILTER_BYTES_MAX {
                let bounded = Filter::parse(&text);
                prop_assert_eq!(bounded.as_ref(), Ok(&parsed));
            }
            let pairs = attributes.iter().map(|(key, value)| (key.as_str(), value.as_str()));
            prop_assert_eq!(parsed.matches(pairs), model(&expression, &attributes), "{}", text);
        }
    }
}
