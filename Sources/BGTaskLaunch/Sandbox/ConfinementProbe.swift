import BGTaskModel
import Foundation
import Glibc
import _BGTaskSystemShims

/// What this machine and these privileges give a launch's confinement, layer by layer, and how
/// to get what is missing (`bgtask doctor`). Reads only: it changes no cgroup and confines
/// nothing. The layers are the run record's `sandbox` layers (`SandboxLayer.names`), plus the
/// kernel-enforced limits of a delegated cgroup.
public enum ConfinementProbe {
    public struct Finding: Codable, Sendable, Equatable {
        public var layer: String
        public var available: Bool
        /// What is there, or why it is not.
        public var detail: String
        /// How to get it, when it is missing.
        public var remedy: String?

        /// The memberwise initializer, for the modules above this one.
        package init(layer: String, available: Bool, detail: String, remedy: String? = nil) {
            self.layer = layer
            self.available = available
            self.detail = detail
            self.remedy = remedy
        }
    }

    public static func findings() -> [Finding] {
        var findings: [Finding] = []
        let abi = Int(bgtask_landlock_abi())
        if abi >= 6 {
            findings.append(Finding(layer: "landlock", available: true, detail: "Landlock ABI \(abi): files, signals and abstract sockets are confined"))
        } else if abi > 0 {
            findings.append(Finding(layer: "landlock", available: true, detail: "Landlock ABI \(abi): files are confined, signals and abstract sockets are not (they need ABI 6, Linux 6.12)",
                                    remedy: "a kernel of Linux 6.12 or later"))
        } else {
            findings.append(Finding(layer: "landlock", available: false, detail: "this kernel has no Landlock (or it is not in the boot's lsm= list)",
                                    remedy: "a kernel built with CONFIG_SECURITY_LANDLOCK and landlock in lsm= (Linux 5.13 or later; 6.12 for signal scoping)"))
        }
        let seccomp = bgtask_seccomp_mode()
        findings.append(seccomp >= 0
            ? Finding(layer: "seccomp", available: true, detail: seccomp == 0 ? "seccomp-bpf filters can be installed" : "this process already runs under a filter; launches add theirs")
            : Finding(layer: "seccomp", available: false, detail: "prctl(PR_GET_SECCOMP): \(String(cString: strerror(errno)))", remedy: "a kernel built with CONFIG_SECCOMP_FILTER"))
        findings.append(Finding(layer: "no_new_privs", available: true, detail: "prctl(PR_SET_NO_NEW_PRIVS) is set for every launch"))
        var namespaceError = [CChar](repeating: 0, count: 512)
        if bgtask_namespaces_available(&namespaceError, namespaceError.count) != 0 {
            findings.append(Finding(layer: "pid_namespace", available: true,
                                    detail: "each launch gets a PID namespace of its own, with its own /proc: it sees no other process, and what it starts ends with it"))
        } else {
            let reason = String(decoding: namespaceError.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            findings.append(Finding(layer: "pid_namespace", available: false, detail: reason,
                                    remedy: "run the host as root (the system unit, Packaging/systemd/bgtask.service), or where CAP_SYS_ADMIN is not withheld (a container's seccomp profile may refuse unshare)"))
        }
        if geteuid() == 0 {
            findings.append(Finding(layer: "uid", available: true, detail: "the host runs as root: each app runs as its own uid (STATE/app-ids), its extensions as the app's, with RLIMIT_NPROC"))
        } else {
            findings.append(Finding(layer: "uid", available: false, detail: "launches run as the host's uid \(geteuid())",
                                    remedy: "run the host as root (the system unit, Packaging/systemd/bgtask.service) for an uid per app"))
        }
        switch CgroupV2.Delegation().find() {
        case let .delegated(directory):
            findings.append(Finding(layer: "cgroup", available: true, detail: "a delegated cgroup v2 directory, \(directory.path): memory.max, pids.max and cgroup.kill per launch with --cgroup auto"))
        case let .refused(reason):
            findings.append(Finding(layer: "cgroup", available: false, detail: reason + "; memory is sampled instead",
                                    remedy: "run the host from its systemd unit (Delegate=yes; Packaging/systemd/) with --cgroup auto"))
        }
        return findings
    }
}
