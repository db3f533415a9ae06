//! The domain's checks of names, messages and settings, and Pub/Sub's defaults for settings
//! left at 0: the model's (`ringpost_model::validate`), which the client applies too, as pure
//! functions of plain values; every protocol's requests are checked by these. Their refusals
//! are the domain's `InvalidArgument`, with the model's message.

use crate::api::Status;
use ringpost_model::Invalid;

pub use ringpost_model::validate::{
    effective_ack_deadline_seconds, effective_expiration_ttl_seconds, effective_max_delivery_attempts,
    effective_retention_seconds, effective_retry_backoff_seconds, retry_backoff_seconds,
    topic_retention_seconds, validate_labels, validate_message, validate_name, validate_push_delivery,
    PUSH_EXACTLY_ONCE_REFUSAL,
};

/// Checks a push configuration as it is set, whichever protocol set it: its endpoint, its
/// attributes and its OIDC token. (Whether it may be set beside exactly-once delivery is
/// `validate_push_delivery`, checked on the settings it would make.)
pub fn validate_push_config(push: &crate::catalog::PushConfig) -> Result<(), Invalid> {
    ringpost_model::validate::validate_push_endpoint(&push.endpoint)?;
    ringpost_model::validate::validate_push_attributes(&push.attributes)?;
    ringpost_model::validate::validate_project(&push.project)?;
    if let Some(token) = &push.oidc_token {
        ringpost_model::validate::validate_push_token(&token.service_account_email, &token.audience)?;
    }
    Ok(())
}

impl From<Invalid> for Status {
    /// The model's refusals are all invalid arguments.
    fn from(invalid: Invalid) -> Status {
        Status::invalid_argument(invalid.message)
    }
}
