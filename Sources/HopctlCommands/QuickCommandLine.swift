import HopStore

/// The command lines of `hopctl status` and `hopctl history` that need no help, no error and no
/// guess, parsed without ArgumentParser.
///
/// ArgumentParser finds a command's options by reflection; the first parse in a process costs
/// about 2 ms, a third of a whole `hopctl status` (Benchmarks/RESULTS.md). The read commands are
/// the ones operators and scripts run in loops, so a command line made only of their own options,
/// each given once as `--name value`, `--name=value` or a bare flag, with values the command accepts,
/// is answered here. Anything else (help, a mistake, an option given twice, a value that starts
/// with `-`) returns nil and goes to ArgumentParser, which parses it, prints the usage and the
/// errors: this parser never reports anything itself. hopctlTests holds it to ArgumentParser's
/// reading of the same command lines.
enum QuickCommandLine {
    /// A command this parser answers.
    enum Request: Equatable {
        case status(StatusRequest)
        case history(HistoryRequest)

        func validate() throws {
            switch self {
            case .status(let request): try request.validate()
            case .history(let request): try request.validate()
            }
        }

        func run() async throws {
            switch self {
            case .status(let request): try await request.run()
            case .history(let request): try await request.run()
            }
        }
    }

    /// The request `arguments` (after the executable's name, options hoisted) ask for, or nil when
    /// ArgumentParser must read them.
    static func request(_ arguments: [String]) -> Request? {
        guard let command = arguments.first else { return nil }
        let rest = arguments.dropFirst()
        let request: Request
        switch command {
        case "status":
            guard
                let given = options(rest, values: ["db", "flow", "subject", "status", "limit"], flags: ["json"])
            else {
                return nil
            }
            var status: RunStatus?
            var limit: Int?
            if let name = given["status"] {
                guard let value = RunStatus(rawValue: name) else { return nil }
                status = value
            }
            if let text = given["limit"] {
                guard let value = Int(text) else { return nil }
                limit = value
            }
            request = .status(
                StatusRequest(
                    db: given["db"], json: given["json"] != nil, flow: given["flow"], subject: given["subject"],
                    status: status, limit: limit))
        case "history":
            guard
                let given = options(
                    rest, values: ["db", "subject", "flow", "run", "limit"], flags: ["json", "all-runs"]),
                let flow = given["flow"]
            else { return nil }
            var run: Int64?
            var limit: Int?
            if let text = given["run"] {
                guard let value = Int64(text) else { return nil }
                run = value
            }
            if let text = given["limit"] {
                guard let value = Int(text) else { return nil }
                limit = value
            }
            request = .history(
                HistoryRequest(
                    db: given["db"], json: given["json"] != nil,
                    subject: given["subject"] ?? SubjectOption.defaultSubject,
                    flow: flow, run: run, limit: limit, allRuns: given["all-runs"] != nil))
        default:
            return nil
        }
        // A request its command refuses is left to ArgumentParser, which reports why.
        return (try? request.validate()) != nil ? request : nil
    }

    /// The long options in `arguments` by name (a flag's value is empty), or nil unless every
    /// argument is one of `values` with a value (not empty, not starting with `-`, unless after
    /// `=`) or one of `flags`, each given once.
    static func options(_ arguments: ArraySlice<String>, values: Set<String>, flags: Set<String>) -> [String: String]? {
        var given: [String: String] = [:]
        var rest = arguments
        while let argument = rest.popFirst() {
            guard argument.hasPrefix("--") else { return nil }
            let option = argument.dropFirst(2)
            let name: String
            let value: String
            if let equals = option.firstIndex(of: "=") {
                name = String(option[..<equals])
                value = String(option[option.index(after: equals)...])
                // ArgumentParser refuses `--name=` with nothing after it.
                guard values.contains(name), !value.isEmpty else { return nil }
            } else if values.contains(String(option)) {
                guard let next = rest.popFirst(), !next.hasPrefix("-") else { return nil }
                name = String(option)
                value = next
            } else if flags.contains(String(option)) {
                name = String(option)
                value = ""
            } else {
                return nil
            }
            guard given.updateValue(value, forKey: name) == nil else { return nil }
        }
        return given
    }
}
