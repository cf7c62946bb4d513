/// The version of bgtask: what `bgtask --version` prints, `bgtask doctor` and `bgtask host` say
/// first, and the man page carries. The one place it is written; raise it with each release.
enum BGTaskVersion {
    static let current = "0.1.0"
}
