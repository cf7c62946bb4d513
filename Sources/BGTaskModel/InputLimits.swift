/// Sizes of what a launch (through a host function) or a client (through the control socket or
/// a bundle) may hand the host, shared by the runner, which checks them before anything is sent,
/// and the host, which checks them again where they enter. Every refusal names the limit.
public enum InputLimits {
    /// A task or bundle identifier, in UTF-8 bytes (an Info.plist entry, `register_handler`,
    /// `submit`, `cancel`, a control request). Apple's identifiers are reverse DNS names, and a
    /// DNS name is at most 253 bytes.
    public static let identifierBytes = 255

    /// A continued-processing request's or task's title or subtitle, in UTF-8 bytes.
    public static let titleBytes = 1024

    /// One `log` call, in UTF-8 bytes: longer messages are cut there, and say so.
    public static let logMessageBytes = 64 * 1024

    /// Entries a run record lists of one kind (refused registrations, submissions); the rest are
    /// counted (`refused_registrations_omitted`, `submitted_omitted`), so that no launch can make
    /// its record too large for a control answer.
    public static let recordListEntries = 100

    /// `description` of a limit in bytes, for messages (`255 bytes`, `64 KiB`, `1 MiB`).
    public static func bytes(_ count: Int) -> String {
        if count >= 1 << 20, count % (1 << 20) == 0 { return "\(count >> 20) MiB" }
        if count >= 1 << 10, count % (1 << 10) == 0 { return "\(count >> 10) KiB" }
        return "\(count) bytes"
    }
}
