import ArgumentParser
import BGTaskControl
import BGTaskModel
import Foundation

/// Options of every verb that talks to a running host.
struct HostOptions: ParsableArguments {
    @OptionGroup var state: StateOptions

    @Flag(name: .long, help: "Print the answer as JSON.")
    var json = false

    /// Sends `command`; prints the error and exits 1 when the host refuses. `hint` puts a
    /// refusal in the CLI's terms (the host's words name no flags).
    func send(_ command: ControlCommand, hint: (ControlFailure) -> String? = { _ in nil }) throws -> ControlResponse {
        let response: ControlResponse
        do {
            response = try ControlClient(stateDirectory: state.stateDirectory).send(command)
        } catch {
            printError(error.description)
            throw ExitCode(Status.noHost)
        }
        if let error = response.error, !response.ok {
            if json { try printJSON(["error": ["code": error.code, "message": error.message]]) }
            printError("\(command.verb.rawValue): \(error.message) [\(error.code)]")
            if let failure = response.failure, let hint = hint(failure) { printError(hint) }
            throw ExitCode(1)
        }
        return response
    }

    /// Sends `call`'s command and returns its typed answer; a refusal is printed as `send`
    /// prints it.
    func call<Answer>(_ call: ControlCall<Answer>, hint: (ControlFailure) -> String? = { _ in nil }) throws -> Answer {
        let response = try send(call.command, hint: hint)
        do { return try call.answer(response) } catch {
            printError("\(call.command.verb.rawValue): \(error.message) [\(error.code.rawValue)]")
            throw ExitCode(1)
        }
    }

    func printJSON<T: Encodable>(_ value: T) throws {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys]
        // Requests as people read them: a refresh request has no strategy, no title.
        encoder.userInfo[TaskRequest.omitsInapplicableFields] = true
        FileHandle.standardOutput.write(try encoder.encode(value) + Data("\n".utf8))
    }

    /// A launch by hand's answer (`open`, `respond`): its record when it waited for it (failing
    /// when the launch did not succeed), else its id after `started`.
    func printLaunch(_ response: ControlResponse, started: String) throws {
        if let record = response.record {
            if json { FileHandle.standardOutput.write(try record.jsonData() + Data("\n".utf8)) } else { print(record) }
            if !record.succeeded { throw ExitCode.failure }
            return
        }
        if json { return try printJSON(["launch_id": response.launchID ?? ""]) }
        print("\(started): launch \(response.launchID ?? "?")")
    }
}

extension Status {
    /// No host answers on the control socket (EX_UNAVAILABLE).
    static let noHost: Int32 = 69
}
